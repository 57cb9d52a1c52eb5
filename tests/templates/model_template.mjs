// Prints a GGUF model's tokenizer.chat_template as JSON (null when it has none), read with
// node-llama-cpp's GGUF reader: the template bmoe-synth wrote, for the reference renderer.
//   node tests/templates/model_template.mjs MODEL.gguf
import {readGgufFileInfo} from "node-llama-cpp";

const info = await readGgufFileInfo(process.argv[2], {readTensorInfo: false});
process.stdout.write(JSON.stringify(info.metadata.tokenizer?.chat_template ?? null));
