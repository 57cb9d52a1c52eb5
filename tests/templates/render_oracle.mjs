// Renders chat templates with @huggingface/jinja, the reference bmoe's Jinja engine is tested
// against. Input (JSON on stdin): {"templates": {name: source}, "contexts": [context, ...]}.
// Output (stdout): {name: [rendered text or {"error": message}, ...]}.
import { Template } from "@huggingface/jinja";

const input = JSON.parse(await new Promise((resolve) => {
  let data = "";
  process.stdin.on("data", (chunk) => (data += chunk));
  process.stdin.on("end", () => resolve(data));
}));
const out = {};
for (const [name, source] of Object.entries(input.templates)) {
  let template;
  try {
    template = new Template(source);
  } catch (e) {
    out[name] = input.contexts.map(() => ({ error: `parse: ${e.message}` }));
    continue;
  }
  out[name] = input.contexts.map((context) => {
    try {
      return template.render(context);
    } catch (e) {
      return { error: e.message };
    }
  });
}
process.stdout.write(JSON.stringify(out));
