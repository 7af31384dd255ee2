//! The built-in minimal runtime: model, weights, backends, paged KV cache, prefix cache,
//! scheduler, sampler, speculative decoding and the OpenAI-compatible server.
//! The runtime core never imports cudarc.
