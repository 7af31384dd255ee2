//! Engine logs, read by `crate::diagnose` (the one parser and the one set of findings for
//! `diagnose`, `e2e --engine-log` and `report`). This module keeps the names e2e uses.
//!
//! KV capacity from a log, for the e2e driver: [`BootLog::kv_capacity`] (tokens and the boot
//! record) and [`BootLog::kv_reading`] / [`kv_capacity_from_log`] (tokens, the 1-based line and
//! how they were read). For llama.cpp the capacity is the `llama_kv_cache: size = … (C cells,
//! L layers, S/T seqs)` line's C × T (cells are per stream; T is 1 when `kv_unified`), else the
//! default-verbosity `load_model: initializing, n_slots = N, n_ctx_slot = C, kv_unified = …`
//! line's N × C (or C alone when unified), else `llama_context: n_ctx` when the oldest form
//! printed a KV cache; `docs/diagnose.md` lists every engine's lines. These signatures are
//! stable: the driver decides the precedence between this reading and an engine endpoint
//! (llama.cpp `/slots`, vLLM `/metrics`).

pub use crate::diagnose::log::{Boot, EngineLog as BootLog, ErrorGroup, KvReading, MarlinFallback};
pub use crate::diagnose::spec::{pool_spec, SpecLogGeneration, SpecLogLine, SpecPooled};

/// The KV capacity an engine log states (the last boot that states one): tokens, the line, and
/// the rule that read them (`2,048 cells × 4 streams (…)`, `n_slots 4 × n_ctx_slot 2,048`,
/// `as printed`). `None` when no line states it; never derived from GiB.
pub fn kv_capacity_from_log(text: &str) -> Option<KvReading> {
    BootLog::parse(text).kv_reading()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llamacpp_capacity_for_the_driver() {
        let r = kv_capacity_from_log(
            "0.00.039.885 I llama_kv_cache: size =    4.00 MiB (  2048 cells,   2 layers,  4/4 seqs), K (f16):    2.00 MiB, V (f16):    2.00 MiB\n",
        )
        .unwrap();
        assert_eq!((r.tokens, r.line), (8_192, 1));
        let r = kv_capacity_from_log(
            "0.00.526.077 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'\n",
        )
        .unwrap();
        assert_eq!(r.tokens, 8_192);
        let r = kv_capacity_from_log(
            "0.00.526.077 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'true'\n",
        )
        .unwrap();
        assert_eq!(r.tokens, 4_096);
        assert!(kv_capacity_from_log("nothing here\n").is_none());
    }
}
