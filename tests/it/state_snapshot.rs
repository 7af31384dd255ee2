//! Recurrent-state snapshots of a Gated-DeltaNet hybrid on the CPU backend
//! (`Backend::snapshot_state` / `restore_state`, docs/runtime.md "State snapshots"): decode after
//! a snapshot is restored equals decode without it, bit for bit.

use rigbench::runtime::backend::cpu::CpuBackend;
use rigbench::runtime::backend::{Backend, ForwardBatch, KvCacheSpec, SeqSegment};
use rigbench::runtime::config::{KvCacheDtype, ModelConfig};

const BLOCK: usize = 4;
const BLOCKS: usize = 16;

fn backend() -> CpuBackend {
    let cfg = ModelConfig::preset("tiny-hybrid").expect("the tiny-hybrid preset");
    assert!(cfg.is_hybrid());
    let w = rigbench::runtime::weights::synthesize(&cfg, 3);
    let mut b = CpuBackend::new(w, 1);
    b.init_kv_cache(KvCacheSpec {
        num_blocks: BLOCKS,
        block_size: BLOCK,
        dtype: KvCacheDtype::Bf16,
    })
    .unwrap();
    b.init_state_slots(2).unwrap();
    b
}

/// One segment of `tokens` at `pos` on `slot`, its last row of logits.
fn step(b: &mut CpuBackend, tokens: &[u32], pos: usize, slot: u32) -> Vec<f32> {
    let batch = ForwardBatch {
        token_ids: tokens.to_vec(),
        seqs: vec![SeqSegment {
            start: 0,
            len: tokens.len(),
            first_pos: pos,
            // Slot 1 writes its KV in other blocks than slot 0.
            block_table: (0..BLOCKS as u32 / 2)
                .map(|i| i + slot * BLOCKS as u32 / 2)
                .collect(),
            num_logits: 1,
            state_slot: slot,
        }],
    };
    let l = b.forward(&batch).unwrap();
    l.row(l.rows() - 1).to_vec()
}

fn argmax(x: &[f32]) -> u32 {
    rigbench::runtime::sampler::argmax(x)
}

/// Greedy decode of `n` tokens from `first` at `pos`, the logits of each step.
fn decode(b: &mut CpuBackend, first: u32, pos: usize, n: usize, slot: u32) -> Vec<Vec<f32>> {
    let mut tok = first;
    let mut out = Vec::new();
    for i in 0..n {
        let l = step(b, &[tok], pos + i, slot);
        tok = argmax(&l);
        out.push(l);
    }
    out
}

#[test]
fn decode_after_a_restored_snapshot_equals_decode_without_it() {
    let prompt = [3u32, 17, 5, 9, 11, 2];
    let mut b = backend();
    let last = step(&mut b, &prompt, 0, 0);
    let first = argmax(&last);
    // Decode 3 tokens, snapshot at position 9, decode 5 more: the run without a restore.
    let head = decode(&mut b, first, prompt.len(), 3, 0);
    let pos = prompt.len() + 3;
    let snap = b.snapshot_state(0).unwrap();
    assert_eq!(snap.position, pos);
    assert!(snap.bytes > 0);
    let next = argmax(head.last().unwrap());
    let plain = decode(&mut b, next, pos, 5, 0);
    // Go back to the snapshot and decode the same 5 again: identical logits.
    b.restore_state(0, &snap).unwrap();
    let again = decode(&mut b, next, pos, 5, 0);
    assert_eq!(plain, again, "decode after the restore differs");

    // The same tokens decoded on a fresh backend, with no snapshot at all, give those logits.
    let mut fresh = backend();
    step(&mut fresh, &prompt, 0, 0);
    decode(&mut fresh, first, prompt.len(), 3, 0);
    let reference = decode(&mut fresh, next, pos, 5, 0);
    assert_eq!(plain, reference);

    // A snapshot moved to another slot continues there as on its own slot (the KV of slot 1 is
    // that of its own prefill of the same prompt).
    step(&mut b, &prompt, 0, 1);
    decode(&mut b, first, prompt.len(), 3, 1);
    b.restore_state(1, &snap).unwrap();
    assert_eq!(decode(&mut b, next, pos, 5, 1), plain);
}

#[test]
fn the_state_matters_and_bad_restores_are_refused() {
    let prompt = [3u32, 17, 5, 9];
    let mut b = backend();
    let first = argmax(&step(&mut b, &prompt, 0, 0));
    let snap = b.snapshot_state(0).unwrap();
    let want = decode(&mut b, first, prompt.len(), 4, 0);
    // Without the restore the slot is 4 tokens further on: continuing at the snapshot's
    // position is refused, not silently computed from the wrong state.
    let batch = ForwardBatch {
        token_ids: vec![first],
        seqs: vec![SeqSegment {
            start: 0,
            len: 1,
            first_pos: prompt.len(),
            block_table: (0..BLOCKS as u32 / 2).collect(),
            num_logits: 1,
            state_slot: 0,
        }],
    };
    let e = b.forward(&batch).unwrap_err().to_string();
    assert!(e.contains("cannot continue"), "{e}");
    // A state from a different sequence (zeros after a reset at one token) gives other logits:
    // the snapshot carries the state, not only the position.
    let mut other = b.snapshot_state(0).unwrap();
    other.position = prompt.len();
    b.restore_state(0, &other).unwrap();
    let moved = decode(&mut b, first, prompt.len(), 4, 0);
    assert_ne!(moved, want, "the restored state had no effect");
    b.restore_state(0, &snap).unwrap();
    assert_eq!(decode(&mut b, first, prompt.len(), 4, 0), want);
    // Out of range, and a snapshot that is not the CPU backend's.
    assert!(b
        .restore_state(5, &snap)
        .unwrap_err()
        .to_string()
        .contains("slot 5"));
    assert!(b.snapshot_state(9).is_err());
    let foreign = rigbench::runtime::backend::StateSnapshot {
        position: 1,
        bytes: 0,
        data: Box::new(0u8),
    };
    assert!(b
        .restore_state(0, &foreign)
        .unwrap_err()
        .to_string()
        .contains("another backend"));
}
