//! Host-side planning of one CUDA forward pass, kept free of CUDA so it is tested on the CPU:
//! the metadata image the kernels read (token ids, positions, KV slots, the block tables, logit
//! rows, which tokens take the decode attention kernel and which the tensor-core prefill tiles),
//! the decode-attention partition count, and the CUDA-graph batch size a decode step is padded
//! to.
//!
//! The image is one `i32` array copied to the device in one transfer. Its regions are laid out
//! from capacities (`Caps`), so a CUDA graph captured for a padded decode batch of `b` tokens
//! finds the same addresses at every replay; the block-table stride (blocks per row) is written
//! into the image's header and read by the kernels, so it may change between replays.

use super::super::{ForwardBatch, SeqSegment};

/// Query rows per tensor-core prefill tile (`FA_BM` in kernels/runtime.cu).
pub const PREFILL_TILE_ROWS: usize = 64;
/// Segments with at least this many tokens take the tensor-core prefill kernel; shorter ones
/// (decode steps, verification of a few drafts) the CUDA-core decode kernel.
pub const PREFILL_MIN_TOKENS: usize = 16;
/// Positions per decode-attention chunk (`ATT_CHUNK` in kernels/runtime.cu).
pub const ATT_CHUNK: usize = 64;
/// Most partitions of one decode-attention query.
pub const MAX_ATT_PARTS: usize = 64;
/// Header ints at the start of the image: `[0]` = block-table stride.
pub const HEADER: usize = 16;

/// Capacities the image is laid out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Tokens.
    pub tokens: usize,
    /// Logit rows.
    pub rows: usize,
    /// Prefill tiles.
    pub tiles: usize,
    /// Segments (block-table rows), one extra for the padding segment of graph batches.
    pub seqs: usize,
}

impl Caps {
    /// Capacities for a batch of `tokens` tokens in at most `seqs` segments with at most
    /// `rows` logit rows.
    pub fn for_batch(tokens: usize, seqs: usize, rows: usize) -> Self {
        Caps {
            tokens,
            rows,
            tiles: tokens.div_ceil(PREFILL_TILE_ROWS) + seqs,
            seqs: seqs + 1,
        }
    }
}

/// Offsets (in i32 units) of each region of the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Token ids.
    pub ids: usize,
    /// Positions.
    pub pos: usize,
    /// KV slots (block · block_size + offset).
    pub slot: usize,
    /// Segment of each token.
    pub tok_seq: usize,
    /// Tokens that take the decode attention kernel.
    pub dec_tok: usize,
    /// Flat token index of each logit row.
    pub rows: usize,
    /// Prefill tiles, 4 ints each: first token, rows, position of row 0, segment.
    pub tiles: usize,
    /// Block tables, `seqs × stride`.
    pub block_tables: usize,
    /// The capacities.
    pub caps: Caps,
}

impl Layout {
    /// The layout for `caps` (regions in the order above, after the header).
    pub fn new(caps: Caps) -> Self {
        let mut o = HEADER;
        let mut take = |n: usize| {
            let at = o;
            o += n;
            at
        };
        let ids = take(caps.tokens);
        let pos = take(caps.tokens);
        let slot = take(caps.tokens);
        let tok_seq = take(caps.tokens);
        let dec_tok = take(caps.tokens);
        let rows = take(caps.rows);
        // int4 tiles need 16-byte alignment.
        let tiles = take(caps.tiles * 4 + 3);
        let tiles = (tiles + 3) & !3;
        let block_tables = take(0);
        Layout {
            ids,
            pos,
            slot,
            tok_seq,
            dec_tok,
            rows,
            tiles,
            block_tables,
            caps,
        }
    }

    /// Ints the image needs with block-table stride `stride`.
    pub fn len(&self, stride: usize) -> usize {
        self.block_tables + self.caps.seqs * stride
    }
}

/// A planned forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Tokens (after padding).
    pub tokens: usize,
    /// Real tokens (before padding).
    pub real_tokens: usize,
    /// Logit rows (after padding).
    pub rows: usize,
    /// Real logit rows.
    pub real_rows: usize,
    /// Tokens that take the decode kernel.
    pub dec_tokens: usize,
    /// Prefill tiles.
    pub tiles: usize,
    /// Block-table stride (blocks per row).
    pub stride: usize,
    /// Decode-attention partitions (grid z).
    pub att_parts: usize,
    /// The image layout.
    pub layout: Layout,
    /// The image.
    pub image: Vec<i32>,
    /// Largest position of any token (for the partition sizing).
    pub max_pos: usize,
}

/// Decode-attention partitions: enough (query, KV head, partition) blocks to give every SM four,
/// at most [`MAX_ATT_PARTS`] and at most the chunks of the longest context, and with
/// `dec_tokens · parts ≤ part_cap` (the partial-result buffer).
pub fn att_parts(
    dec_tokens: usize,
    kv_heads: usize,
    sm_count: usize,
    max_ctx: usize,
    part_cap: usize,
) -> usize {
    if dec_tokens == 0 {
        return 1;
    }
    let want = (4 * sm_count).div_ceil(dec_tokens * kv_heads.max(1));
    let chunks = max_ctx.div_ceil(ATT_CHUNK).max(1);
    want.clamp(1, MAX_ATT_PARTS)
        .min(chunks)
        .min((part_cap / dec_tokens).max(1))
}

/// Least elements per slice of `rt_silu_mul_quant` (one per thread of its 1,024-thread block).
pub const SILU_QUANT_MIN_SLICE: usize = 1024;
/// Most slices per row of `rt_silu_mul_quant`.
pub const SILU_QUANT_MAX_SLICES: usize = 32;

/// Slices per row of `rt_silu_mul_quant` (grid y) for `t` rows of `i` elements: enough blocks
/// to give each SM one (`t · slices ≥ sm_count`), at least [`SILU_QUANT_MIN_SLICE`] elements
/// per slice, at most [`SILU_QUANT_MAX_SLICES`], at least 1.
pub fn silu_quant_slices(t: usize, i: usize, sm_count: usize) -> usize {
    let want = sm_count.div_ceil(t.max(1));
    want.min(i / SILU_QUANT_MIN_SLICE)
        .clamp(1, SILU_QUANT_MAX_SLICES)
}

/// Errors of an inconsistent batch.
fn check(batch: &ForwardBatch, block_size: usize, num_blocks: usize) -> anyhow::Result<()> {
    let mut total = 0;
    for s in &batch.seqs {
        anyhow::ensure!(
            s.start == total && s.len > 0 && s.num_logits <= s.len,
            "malformed segment {s:?}"
        );
        total += s.len;
        let need = (s.first_pos + s.len).div_ceil(block_size);
        anyhow::ensure!(
            s.block_table.len() >= need,
            "block table of {} blocks does not cover position {}",
            s.block_table.len(),
            s.first_pos + s.len - 1
        );
        if let Some(b) = s.block_table.iter().find(|b| **b as usize >= num_blocks) {
            anyhow::bail!("block {b} out of range (the cache has {num_blocks})");
        }
    }
    anyhow::ensure!(
        total == batch.token_ids.len(),
        "segments cover {total} tokens of {}",
        batch.token_ids.len()
    );
    Ok(())
}

/// Whether `batch` is a plain decode step (every segment one token with one logit row), the
/// kind of step CUDA graphs replay.
pub fn is_decode_step(batch: &ForwardBatch) -> bool {
    !batch.seqs.is_empty() && batch.seqs.iter().all(|s| s.len == 1 && s.num_logits == 1)
}

/// The smallest captured batch size that holds `b` decode tokens, if any.
pub fn graph_batch(b: usize, sizes: &[usize]) -> Option<usize> {
    sizes.iter().copied().filter(|s| *s >= b).min()
}

/// The CUDA-graph batch sizes for `max_num_seqs`: 1, 2, 4, 8, then steps of 8 up to 64, then
/// powers of two, capped at `max_num_seqs` (which is always included).
pub fn graph_sizes(max_num_seqs: usize) -> Vec<usize> {
    let mut v: Vec<usize> = vec![1, 2, 4];
    let mut s = 8;
    while s <= 64 {
        v.push(s);
        s += 8;
    }
    let mut p = 128;
    while p <= 512 {
        v.push(p);
        p *= 2;
    }
    v.retain(|s| *s <= max_num_seqs);
    if !v.contains(&max_num_seqs) {
        v.push(max_num_seqs);
    }
    v.sort_unstable();
    v
}

/// What the planner needs to know of the cache and device.
#[derive(Debug, Clone, Copy)]
pub struct PlanEnv {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks the engine may use (the trash block for padding is `num_blocks`, allocated
    /// beyond them).
    pub num_blocks: usize,
    /// Vocabulary (token ids are checked against it).
    pub vocab: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// SMs.
    pub sm_count: usize,
    /// Decode-attention partial-result capacity (query tokens × partitions).
    pub part_cap: usize,
    /// Whether the tensor-core prefill kernel is usable (head_dim supported and its self-check
    /// passed).
    pub tc_prefill: bool,
}

/// Plan `batch`. With `pad_to = Some(b)` (a decode step replayed by the graph of batch `b`),
/// the batch is padded with dummy tokens (id 0, position 0, the trash slot, a padding segment
/// whose block table is the trash block) and laid out for exactly `b` tokens; otherwise the
/// layout is compact for this batch.
///
/// # Errors
/// An inconsistent batch: malformed segments, block tables that do not cover the positions,
/// blocks out of range, token ids outside the vocabulary.
pub fn plan(batch: &ForwardBatch, env: &PlanEnv, pad_to: Option<usize>) -> anyhow::Result<Plan> {
    check(batch, env.block_size, env.num_blocks)?;
    if let Some(id) = batch.token_ids.iter().find(|t| **t as usize >= env.vocab) {
        anyhow::bail!("token id {id} is outside the vocabulary ({})", env.vocab);
    }
    let real_tokens = batch.token_ids.len();
    let real_rows = batch.num_logits();
    let (tokens, rows, nseq) = match pad_to {
        Some(b) => {
            anyhow::ensure!(
                is_decode_step(batch) && real_tokens <= b,
                "only decode steps of at most {b} tokens are padded to a graph batch"
            );
            (b, b, b)
        }
        None => (real_tokens, real_rows, batch.seqs.len()),
    };
    let caps = Caps::for_batch(tokens, nseq, rows);
    let layout = Layout::new(caps);
    let trash = env.num_blocks as i32;
    let stride = batch
        .seqs
        .iter()
        .map(|s| s.block_table.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut image = vec![0i32; layout.len(stride)];
    image[0] = stride as i32;
    let bs = env.block_size;
    let mut dec = 0usize;
    let mut tiles = 0usize;
    let mut row = 0usize;
    let mut max_pos = 0usize;
    let slot_of =
        |s: &SeqSegment, p: usize| -> i32 { (s.block_table[p / bs] as usize * bs + p % bs) as i32 };
    for (si, s) in batch.seqs.iter().enumerate() {
        for i in 0..s.len {
            let t = s.start + i;
            let p = s.first_pos + i;
            max_pos = max_pos.max(p);
            image[layout.ids + t] = batch.token_ids[t] as i32;
            image[layout.pos + t] = p as i32;
            image[layout.slot + t] = slot_of(s, p);
            image[layout.tok_seq + t] = si as i32;
        }
        let prefill = env.tc_prefill && s.len >= PREFILL_MIN_TOKENS;
        if prefill {
            let mut r0 = 0;
            while r0 < s.len {
                let n = PREFILL_TILE_ROWS.min(s.len - r0);
                let at = layout.tiles + 4 * tiles;
                image[at] = (s.start + r0) as i32;
                image[at + 1] = n as i32;
                image[at + 2] = (s.first_pos + r0) as i32;
                image[at + 3] = si as i32;
                tiles += 1;
                r0 += n;
            }
        } else {
            for i in 0..s.len {
                image[layout.dec_tok + dec] = (s.start + i) as i32;
                dec += 1;
            }
        }
        for i in (s.len - s.num_logits)..s.len {
            image[layout.rows + row] = (s.start + i) as i32;
            row += 1;
        }
        let bt = layout.block_tables + si * stride;
        for (j, b) in s.block_table.iter().enumerate() {
            image[bt + j] = *b as i32;
        }
    }
    // Padding: dummy tokens in their own segment, reading and writing only the trash block.
    if pad_to.is_some() {
        let pad_seq = batch.seqs.len();
        let bt = layout.block_tables + pad_seq * stride;
        image[bt] = trash;
        for t in real_tokens..tokens {
            image[layout.ids + t] = 0;
            image[layout.pos + t] = 0;
            image[layout.slot + t] = trash * bs as i32;
            image[layout.tok_seq + t] = pad_seq as i32;
            image[layout.dec_tok + dec] = t as i32;
            dec += 1;
            image[layout.rows + row] = t as i32;
            row += 1;
        }
    }
    // A graph replays its partition count at every context length: size it for the longest.
    let ctx_for_parts = if pad_to.is_some() {
        usize::MAX / 2
    } else {
        max_pos + 1
    };
    let att_parts = att_parts(dec, env.kv_heads, env.sm_count, ctx_for_parts, env.part_cap);
    Ok(Plan {
        tokens,
        real_tokens,
        rows,
        real_rows,
        dec_tokens: dec,
        tiles,
        stride,
        att_parts,
        layout,
        image,
        max_pos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> PlanEnv {
        PlanEnv {
            block_size: 4,
            num_blocks: 10,
            vocab: 100,
            kv_heads: 2,
            sm_count: 8,
            part_cap: 64,
            tc_prefill: true,
        }
    }

    fn seg(start: usize, len: usize, first_pos: usize, bt: Vec<u32>, logits: usize) -> SeqSegment {
        SeqSegment {
            start,
            len,
            first_pos,
            block_table: bt,
            num_logits: logits,
            state_slot: 0,
        }
    }

    #[test]
    fn mixed_batch_splits_prefill_tiles_and_decode_tokens() {
        // A 20-token prefill chunk (positions 0..20, blocks 0..5) and a decode token at position 9.
        let mut ids: Vec<u32> = (0..20).collect();
        ids.push(42);
        let b = ForwardBatch {
            token_ids: ids,
            seqs: vec![
                seg(0, 20, 0, vec![0, 1, 2, 3, 4], 1),
                seg(20, 1, 9, vec![7, 8, 9], 1),
            ],
        };
        let p = plan(&b, &env(), None).unwrap();
        let l = p.layout;
        assert_eq!(p.tokens, 21);
        assert_eq!(p.tiles, 1, "20 rows fit one 64-row tile");
        assert_eq!(p.dec_tokens, 1);
        assert_eq!(p.stride, 5);
        assert_eq!(p.image[0], 5);
        assert_eq!(&p.image[l.tiles..l.tiles + 4], &[0, 20, 0, 0]);
        assert_eq!(p.image[l.dec_tok], 20);
        // Decode token: position 9 -> block 2 of its table (= 9), offset 1 -> slot 37.
        assert_eq!(p.image[l.pos + 20], 9);
        assert_eq!(p.image[l.slot + 20], 9 * 4 + 1);
        assert_eq!(p.image[l.tok_seq + 20], 1);
        // Prefill token 6: block 1, offset 2 -> slot 6.
        assert_eq!(p.image[l.slot + 6], 6);
        // Logit rows: the chunk's last token and the decode token.
        assert_eq!(&p.image[l.rows..l.rows + 2], &[19, 20]);
        // Block tables with stride 5.
        assert_eq!(
            &p.image[l.block_tables..l.block_tables + 10],
            &[0, 1, 2, 3, 4, 7, 8, 9, 0, 0]
        );
        assert_eq!(l.tiles % 4, 0, "int4 tiles are 16-byte aligned");
    }

    #[test]
    fn short_segments_and_no_tensor_cores_take_the_decode_kernel() {
        let b = ForwardBatch {
            token_ids: vec![1; 20],
            seqs: vec![seg(0, 20, 0, vec![0, 1, 2, 3, 4], 1)],
        };
        let mut e = env();
        e.tc_prefill = false;
        let p = plan(&b, &e, None).unwrap();
        assert_eq!((p.tiles, p.dec_tokens), (0, 20));
        // Verification of 3 drafts (4 tokens, 4 logits) is a decode-kernel segment.
        let b = ForwardBatch {
            token_ids: vec![1; 4],
            seqs: vec![seg(0, 4, 8, vec![0, 1, 2], 4)],
        };
        let p = plan(&b, &env(), None).unwrap();
        assert_eq!((p.tiles, p.dec_tokens, p.rows), (0, 4, 4));
    }

    #[test]
    fn long_prefill_is_cut_into_64_row_tiles() {
        let n: usize = 150;
        let blocks: Vec<u32> = vec![0; n.div_ceil(4)];
        let mut e = env();
        e.num_blocks = 1;
        let b = ForwardBatch {
            token_ids: vec![3; n],
            seqs: vec![seg(0, n, 0, blocks, 0)],
        };
        let p = plan(&b, &e, None).unwrap();
        assert_eq!(p.tiles, 3);
        let t = p.layout.tiles;
        assert_eq!(&p.image[t + 4..t + 8], &[64, 64, 64, 0]);
        assert_eq!(&p.image[t + 8..t + 12], &[128, 22, 128, 0]);
        assert_eq!(p.rows, 0);
    }

    #[test]
    fn decode_steps_pad_to_the_graph_batch_with_trash_slots() {
        let b = ForwardBatch {
            token_ids: vec![5, 6, 7],
            seqs: vec![
                seg(0, 1, 3, vec![1], 1),
                seg(1, 1, 0, vec![2], 1),
                seg(2, 1, 5, vec![3, 4], 1),
            ],
        };
        assert!(is_decode_step(&b));
        let e = env();
        let p = plan(&b, &e, Some(4)).unwrap();
        let l = p.layout;
        assert_eq!(
            (p.tokens, p.real_tokens, p.rows, p.dec_tokens),
            (4, 3, 4, 4)
        );
        assert_eq!(
            p.image[l.slot + 3],
            10 * 4,
            "padding writes the trash block"
        );
        assert_eq!(p.image[l.tok_seq + 3], 3);
        assert_eq!(p.image[l.block_tables + 3 * p.stride], 10);
        // The same padded size gives the same layout whatever the real batch.
        let b1 = ForwardBatch {
            token_ids: vec![5],
            seqs: vec![seg(0, 1, 3, vec![1], 1)],
        };
        assert_eq!(plan(&b1, &e, Some(4)).unwrap().layout, l);
        // Prefill is never padded.
        let pre = ForwardBatch {
            token_ids: vec![5, 6],
            seqs: vec![seg(0, 2, 0, vec![1], 1)],
        };
        assert!(plan(&pre, &e, Some(4)).is_err());
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let e = env();
        let short_table = ForwardBatch {
            token_ids: vec![1; 5],
            seqs: vec![seg(0, 5, 0, vec![0], 1)],
        };
        assert!(plan(&short_table, &e, None)
            .unwrap_err()
            .to_string()
            .contains("does not cover"));
        let out_of_range = ForwardBatch {
            token_ids: vec![1],
            seqs: vec![seg(0, 1, 0, vec![10], 1)],
        };
        assert!(plan(&out_of_range, &e, None).is_err());
        let bad_id = ForwardBatch {
            token_ids: vec![100],
            seqs: vec![seg(0, 1, 0, vec![0], 1)],
        };
        assert!(plan(&bad_id, &e, None)
            .unwrap_err()
            .to_string()
            .contains("vocabulary"));
        let gap = ForwardBatch {
            token_ids: vec![1, 2],
            seqs: vec![seg(1, 1, 0, vec![0], 1)],
        };
        assert!(plan(&gap, &e, None).is_err());
    }

    #[test]
    fn graph_sizes_and_selection() {
        assert_eq!(graph_sizes(4), vec![1, 2, 4]);
        assert_eq!(graph_sizes(20), vec![1, 2, 4, 8, 16, 20]);
        let s = graph_sizes(256);
        assert_eq!(s.last(), Some(&256));
        assert!(s.contains(&64) && s.contains(&128));
        assert_eq!(graph_batch(5, &s), Some(8));
        assert_eq!(graph_batch(300, &s), None);
    }

    #[test]
    fn attention_partitions_fill_the_gpu_within_bounds() {
        // Batch 1, 8 KV heads, 132 SMs, 4096-token context: 528 blocks wanted -> 66 parts,
        // capped at 64.
        assert_eq!(att_parts(1, 8, 132, 4096, 1024), 64);
        // Short context: no more parts than 64-position chunks.
        assert_eq!(att_parts(1, 8, 132, 100, 1024), 2);
        assert_eq!(att_parts(1, 8, 132, 60, 1024), 1);
        // Large batch: one or two parts each.
        assert_eq!(att_parts(64, 8, 132, 4096, 1024), 2);
        assert_eq!(att_parts(128, 8, 132, 4096, 1024), 1);
        // The partial buffer bounds it.
        assert_eq!(att_parts(8, 1, 132, 1 << 20, 16), 2);
        assert_eq!(att_parts(0, 8, 132, 10, 16), 1);
    }

    #[test]
    fn silu_quant_slices_fill_the_sms_at_small_batches() {
        // Qwen3-8B (I = 12,288) and Qwen3-32B (I = 25,600) at M = 1 on 132 SMs.
        assert_eq!(silu_quant_slices(1, 12_288, 132), 12);
        assert_eq!(silu_quant_slices(1, 25_600, 132), 25);
        assert_eq!(silu_quant_slices(1, 1 << 20, 132), SILU_QUANT_MAX_SLICES);
        assert_eq!(silu_quant_slices(8, 25_600, 132), 17);
        // One block per row once the rows alone cover the SMs, and for short rows.
        assert_eq!(silu_quant_slices(132, 25_600, 132), 1);
        assert_eq!(silu_quant_slices(4096, 25_600, 132), 1);
        assert_eq!(silu_quant_slices(1, 1000, 132), 1);
        assert_eq!(silu_quant_slices(0, 0, 0), 1);
    }
}
