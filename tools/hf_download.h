// -hf repo[:quant] / --hf-repo / --hf-file: a GGUF from Hugging Face, the way llama.cpp fetches
// it, into the same cache folder so either tool finds what the other downloaded.
//
// The repository's main commit comes from {endpoint}api/models/{repo}/refs, its files from
// {endpoint}api/models/{repo}/tree/{commit}?recursive=true; the model file is --hf-file, else
// the one whose name carries the quant tag (default Q4_K_M, then Q8_0, then the first GGUF);
// a split model brings every shard. Files land in the Hugging Face hub layout:
// CACHE/models--{user}--{repo}/blobs/{oid}, linked from snapshots/{commit}/{path}, with
// refs/main naming the commit. CACHE: $LLAMA_CACHE, $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE,
// $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. The endpoint:
// $MODEL_ENDPOINT or $HF_ENDPOINT (default https://huggingface.co/); $HF_TOKEN is sent as a
// bearer token. A download is written to BLOB.downloadInProgress and resumed from its length
// (an HTTP range) when run again. Offline, a repository already in the cache is used as is.
#pragma once

#include <string>

namespace bmoe {

struct HfRequest {
  std::string repo;  // user/model, optionally :QUANT
  std::string file;  // a path in the repository (empty: chosen by the quant tag)
};

// The local path of the model's first (or only) file, downloaded when missing. Fails
// (bmoe::Error, one line) on a bad repo name, a missing file, or no network and no cached copy.
std::string hf_fetch_model(const HfRequest& request);

}  // namespace bmoe
