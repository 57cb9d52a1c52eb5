// Prints GGUF models' tokenizer.chat_template values as a JSON list, one per model given (null
// for a model without one), read with node-llama-cpp's GGUF reader: the templates bmoe-synth
// wrote, for the reference renderer. One process for all the models (node's start is most of it).
//   node tests/templates/model_template.mjs MODEL.gguf...
import {readGgufFileInfo} from "node-llama-cpp";

const templates = [];
for (const path of process.argv.slice(2)) {
  const info = await readGgufFileInfo(path, {readTensorInfo: false});
  templates.push(info.metadata.tokenizer?.chat_template ?? null);
}
process.stdout.write(JSON.stringify(templates));
