//! e2e against mocks that answer as the real engines did: llama.cpp's `llama-server`
//! (commit 0c1e57098) and vLLM 0.32 (CPU), from `tests/fixtures/real/engines/` (their `/slots`,
//! `/metrics` scrapes, logs and SSE captures; these tests fail when the folder is absent).
//!
//! The mock is a small HTTP/1.1 server on 127.0.0.1:0 written here (not axum) so it can behave
//! as the engines' servers do on the wire:
//! - llama.cpp's `POST /tokenize` takes `{"content"}` and answers vLLM's `{"prompt"}` with
//!   `200 {"tokens": []}`; vLLM's takes `{"prompt"}` or `{"messages"}`;
//! - kept-alive connections: llama-server closes an idle one after 5 s (`Keep-Alive:
//!   timeout=5`). A client that sends on it as it closes gets its request reset with no answer.
//!   The mock does exactly that to a request that arrives on a connection idle longer than its
//!   keep-alive (it does not close idle connections on its own, so the crossing happens every
//!   time rather than by chance);
//! - SSE captures are replayed event by event, with the engine's own grouping (llama-server
//!   writes several events at once under load); the captures hold no arrival times, so the
//!   delays are set here and named as such;
//! - prompt tokens (`usage.prompt_tokens`) are counted with the tiny Qwen3 fixture's real BPE
//!   tokenizer over the fixture's chat template, so the template overhead is real;
//! - prefix-cache counters move as the engines' do: llama.cpp's `prompt_tokens_cached_total` by
//!   the longest common prefix with an earlier prompt, vLLM's `prefix_cache_hits_total` by whole
//!   16-token blocks.
//!
//! One module of the `it` test binary, split by concern: `mock` (the engines, fixtures and
//! session helpers), `prompts`, `connections`, `tokens`, `llamacpp`, `run_facts`.

mod connections;
mod llamacpp;
mod mock;
mod prompts;
mod run_facts;
mod tokens;
