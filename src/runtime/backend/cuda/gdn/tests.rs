//! Host-side tests of the hybrid's CUDA code (no GPU needed): the segment plan against the CPU
//! backend's forms and slots, the kernel names against the source, the shape limits and sizes.

use super::*;
use crate::runtime::backend::SeqSegment;

fn seg(start: usize, len: usize, first_pos: usize, slot: u32, logits: usize) -> SeqSegment {
    SeqSegment {
        start,
        len,
        first_pos,
        block_table: vec![0],
        num_logits: logits,
        state_slot: slot,
    }
}

#[test]
fn segments_take_the_cpu_backends_forms_and_slots_continue() {
    let mut pos = vec![0usize; 4];
    // A prefill chunk (chunked), a decode token (recurrent), a verification (recurrent).
    let b = ForwardBatch {
        token_ids: vec![1; 10],
        seqs: vec![seg(0, 6, 0, 2, 1), seg(6, 1, 0, 0, 1), seg(7, 3, 0, 3, 3)],
    };
    let p = gdn_plan(&b, None, &mut pos).unwrap();
    assert_eq!(p.all, vec![[0, 6, 2, 1], [6, 1, 0, 1], [7, 3, 3, 1]]);
    assert_eq!(p.chunked, vec![[0, 6, 2, 1]]);
    assert_eq!(p.recurrent, vec![[6, 1, 0, 1], [7, 3, 3, 1]]);
    assert_eq!(pos, vec![1, 0, 6, 3]);
    // The next step continues (reset 0) and pads a graph batch with trash-slot rows.
    let b = ForwardBatch {
        token_ids: vec![1; 2],
        seqs: vec![seg(0, 1, 6, 2, 1), seg(1, 1, 1, 0, 1)],
    };
    let p = gdn_plan(&b, Some(4), &mut pos).unwrap();
    assert_eq!(
        p.recurrent,
        vec![[0, 1, 2, 0], [1, 1, 0, 0], [2, 1, 4, 1], [3, 1, 4, 1]]
    );
    assert!(p.chunked.is_empty());
    assert_eq!(pos, vec![2, 0, 7, 3]);
    // No rollback on the GPU; slots out of range or shared are errors.
    for (bad, want) in [
        (seg(0, 1, 5, 2, 1), "cannot continue"),
        (seg(0, 1, 0, 4, 1), "state slot 4"),
    ] {
        let b = ForwardBatch {
            token_ids: vec![1],
            seqs: vec![bad],
        };
        let e = gdn_plan(&b, None, &mut pos.clone())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    let b = ForwardBatch {
        token_ids: vec![1; 2],
        seqs: vec![seg(0, 1, 0, 1, 1), seg(1, 1, 0, 1, 1)],
    };
    assert!(gdn_plan(&b, None, &mut pos)
        .unwrap_err()
        .to_string()
        .contains("two segments"));
}

#[test]
fn kernel_names_are_in_the_source() {
    for k in GDN_KERNELS {
        assert!(
            GDN_SRC.contains(&format!(" {k}(")),
            "{k} missing from kernels/gdn.cu"
        );
    }
}

#[test]
fn shapes_and_sizes() {
    let c = crate::runtime::hybrid::qwen36_27b();
    assert!(unsupported_shape(&c).is_none());
    // [in_proj_qkv; in_proj_z] (10,240 + 6,144 rows) is wider than [q·gate; k; v] (14,336).
    assert_eq!(max_fused_rows(&c), 16_384);
    let mut bad = c.clone();
    bad.head_dim = 512;
    assert!(unsupported_shape(&bad).unwrap().contains("head_dim 512"));
    // 27B: the KV cache of 16 attention layers, the attention index skips GDN layers.
    assert_eq!(attention_index(&c, 3), 0);
    assert_eq!(attention_index(&c, 7), 1);
    assert_eq!(attention_index(&c, 63), 15);
    assert_eq!(
        kv_cache_bytes(&c, 9, 16, KvCacheDtype::Bf16),
        2 * 16 * 10 * 4 * 16 * 256 * 2
    );
    // Weights: BF16 about 53.6 GB, W4A16 less than a third of the linears.
    let bf = predicted_weight_bytes(&c, QuantRecipe::Uniform(WeightFormat::Bf16)) as f64;
    assert!((53.0e9..54.5e9).contains(&bf), "{bf}");
    let mixed = predicted_weight_bytes(&c, QuantRecipe::Nvfp4Mixed) as f64;
    let nv = predicted_weight_bytes(&c, QuantRecipe::Uniform(WeightFormat::Nvfp4)) as f64;
    assert!(nv < mixed && mixed < bf, "{nv} {mixed} {bf}");
}
