//! The paged KV cache (Kwon et al., "Efficient Memory Management for Large Language Model
//! Serving with PagedAttention", SOSP 2023): memory is cut into blocks of `block_size` token
//! slots; each sequence owns a block table mapping its logical blocks to physical ones.
//!
//! - [`BlockPool`]: the allocator (reference counts, an LRU free queue in which freed blocks
//!   that still hold a cached prefix stay reusable until evicted, and the [`PrefixCache`]), as
//!   in vLLM V1's `BlockPool`;
//! - [`PagedKvStore`]: host storage for the CPU backend, `[layer][slot][kv_head · head_dim]`
//!   for K and for V, in BF16 or FP8 E4M3 with a per-layer scale;
//! - [`kv_bytes_per_block`] and [`KvCapacity`]: the capacity computed from a memory budget and
//!   the startup line.

use std::collections::BTreeMap;

use super::config::{KvCacheDtype, ModelConfig};
use super::prefix_cache::{BlockHash, PrefixCache};
use crate::formats::e4m3;

/// Bytes one block takes over all layers with a KV cache, K and V: `2 · layers · kv_heads ·
/// head_dim · block_size · bytes(dtype)` (scales are per layer and not counted). Only the
/// full-attention layers of a Gated-DeltaNet hybrid count; its other layers keep a fixed state
/// per sequence instead ([`ModelConfig::gdn_state_bytes`]).
pub fn kv_bytes_per_block(config: &ModelConfig, block_size: usize, dtype: KvCacheDtype) -> u64 {
    2 * config.num_attention_layers() as u64
        * config.kv_dim() as u64
        * block_size as u64
        * dtype.bytes() as u64
}

/// KV capacity: blocks that fit the budget and what they mean for requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvCapacity {
    /// Physical blocks.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Longest request (prompt + output).
    pub max_model_len: usize,
}

impl KvCapacity {
    /// Blocks for `budget_bytes`.
    ///
    /// # Errors
    /// A message naming `--kv-cache-memory` and `--max-model-len` when not even one request of
    /// `max_model_len` tokens fits (as vLLM refuses to start in that case).
    pub fn from_budget(
        config: &ModelConfig,
        block_size: usize,
        dtype: KvCacheDtype,
        budget_bytes: u64,
        max_model_len: usize,
    ) -> Result<Self, String> {
        let per_block = kv_bytes_per_block(config, block_size, dtype).max(1);
        let num_blocks = (budget_bytes / per_block) as usize;
        let need = max_model_len.div_ceil(block_size);
        if num_blocks < need.max(1) {
            use crate::output::table::{human_bytes, plural, thousands};
            let fits = num_blocks * block_size;
            let at_least = need.max(1) as u64 * per_block;
            // Lowering --max-model-len helps only when at least one block fits.
            let advice = if num_blocks == 0 {
                format!(
                    "raise --kv-cache-memory to at least {} ({} bytes) for one request of --max-model-len {} tokens",
                    human_bytes(at_least),
                    thousands(at_least),
                    thousands(max_model_len as u64)
                )
            } else {
                format!(
                    "raise --kv-cache-memory to at least {} ({} bytes) or lower --max-model-len to at most {}",
                    human_bytes(at_least),
                    thousands(at_least),
                    thousands(fits as u64)
                )
            };
            return Err(format!(
                "--kv-cache-memory {} ({} bytes) holds {} ({} × {block_size} tokens, {} bytes per block), fewer than one request of --max-model-len {} tokens needs; {advice}",
                human_bytes(budget_bytes),
                thousands(budget_bytes),
                plural(fits as u64, "KV token", "KV tokens"),
                plural(num_blocks as u64, "block", "blocks"),
                thousands(per_block),
                thousands(max_model_len as u64),
            ));
        }
        Ok(KvCapacity {
            num_blocks,
            block_size,
            max_model_len,
        })
    }

    /// Tokens the cache holds.
    pub fn tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Requests of `max_model_len` tokens that fit at once (vLLM: blocks / blocks per request).
    pub fn max_concurrency(&self) -> f64 {
        self.num_blocks as f64 / self.max_model_len.div_ceil(self.block_size) as f64
    }

    /// The startup line, e.g. `KV cache: 1,234,560 tokens (77,160 blocks × 16); max concurrency
    /// at 32,768 tokens: 37.7x`.
    pub fn line(&self) -> String {
        use crate::output::table::thousands;
        format!(
            "KV cache: {} tokens ({} blocks × {}); max concurrency at {} tokens: {:.1}x",
            thousands(self.tokens() as u64),
            thousands(self.num_blocks as u64),
            self.block_size,
            thousands(self.max_model_len as u64),
            self.max_concurrency()
        )
    }
}

/// The block allocator with prefix caching.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_cnt: Vec<u32>,
    /// Free blocks in eviction order (smallest key first).
    free: BTreeMap<u64, u32>,
    free_key: Vec<Option<u64>>,
    next_key: u64,
    cache: Option<PrefixCache>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, all free; `prefix_caching` enables the hash map.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let mut p = BlockPool {
            block_size,
            ref_cnt: vec![0; num_blocks],
            free: BTreeMap::new(),
            free_key: vec![None; num_blocks],
            next_key: 0,
            cache: prefix_caching.then(|| PrefixCache::new(num_blocks)),
        };
        for b in 0..num_blocks as u32 {
            p.push_free(b);
        }
        p
    }

    fn push_free(&mut self, b: u32) {
        let k = self.next_key;
        self.next_key += 1;
        self.free.insert(k, b);
        self.free_key[b as usize] = Some(k);
    }

    fn remove_free(&mut self, b: u32) {
        if let Some(k) = self.free_key[b as usize].take() {
            self.free.remove(&k);
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks with no owner (including evictable cached ones).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks owned by running requests, 0..1 (vLLM `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.ref_cnt.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free() as f64 / self.num_blocks() as f64
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.cache.is_some()
    }

    /// Take the least recently freed block, evicting its cached prefix. `None` when full.
    pub fn allocate(&mut self) -> Option<u32> {
        let (_, b) = self.free.pop_first()?;
        self.free_key[b as usize] = None;
        if let Some(c) = &mut self.cache {
            c.evict(b);
        }
        self.ref_cnt[b as usize] = 1;
        Some(b)
    }

    /// Take one more reference to a (cached) block.
    pub fn touch(&mut self, b: u32) {
        if self.ref_cnt[b as usize] == 0 {
            self.remove_free(b);
        }
        self.ref_cnt[b as usize] += 1;
    }

    /// Drop a sequence's references. Blocks are released tail first, so the tail of a prefix
    /// is evicted before its head (as vLLM frees in reverse order).
    pub fn free(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let r = &mut self.ref_cnt[b as usize];
            debug_assert!(*r > 0, "double free of block {b}");
            if *r > 0 {
                *r -= 1;
                if *r == 0 {
                    self.push_free(b);
                }
            }
        }
    }

    /// Cached blocks for the longest prefix of `hashes` (empty without prefix caching).
    pub fn lookup(&self, hashes: &[BlockHash]) -> Vec<u32> {
        self.cache
            .as_ref()
            .map(|c| c.lookup(hashes))
            .unwrap_or_default()
    }

    /// Of `blocks`, how many are currently free (touching them would take them off the queue).
    pub fn count_free(&self, blocks: &[u32]) -> usize {
        blocks
            .iter()
            .filter(|b| self.ref_cnt[**b as usize] == 0)
            .count()
    }

    /// Register a full block's hash.
    pub fn cache_block(&mut self, b: u32, h: BlockHash) {
        if let Some(c) = &mut self.cache {
            c.insert(b, h);
        }
    }

    /// Forget every cached prefix (blocks in use stay allocated).
    pub fn reset_prefix_cache(&mut self) {
        if let Some(c) = &mut self.cache {
            c.reset();
        }
    }

    /// Blocks holding a cached prefix.
    pub fn num_cached(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.len())
    }
}

/// One layer's K or V storage.
#[derive(Debug, Clone)]
enum KvData {
    Bf16(Vec<u16>),
    Fp8(Vec<u8>),
}

/// Host storage of the paged KV cache (the CPU backend's).
#[derive(Debug, Clone)]
pub struct PagedKvStore {
    block_size: usize,
    num_blocks: usize,
    kv_dim: usize,
    dtype: KvCacheDtype,
    k: Vec<KvData>,
    v: Vec<KvData>,
    k_scale: Vec<f32>,
    v_scale: Vec<f32>,
}

impl PagedKvStore {
    /// Zeroed storage for `num_blocks` blocks. `scales` are per layer `(k_scale, v_scale)` for
    /// FP8 (ignored for BF16).
    pub fn new(
        num_layers: usize,
        kv_dim: usize,
        num_blocks: usize,
        block_size: usize,
        dtype: KvCacheDtype,
        scales: &[(f32, f32)],
    ) -> Self {
        let n = num_blocks * block_size * kv_dim;
        let make = || match dtype {
            KvCacheDtype::Bf16 => KvData::Bf16(vec![0u16; n]),
            KvCacheDtype::Fp8 => KvData::Fp8(vec![0u8; n]),
        };
        PagedKvStore {
            block_size,
            num_blocks,
            kv_dim,
            dtype,
            k: (0..num_layers).map(|_| make()).collect(),
            v: (0..num_layers).map(|_| make()).collect(),
            k_scale: (0..num_layers)
                .map(|l| scales.get(l).map_or(1.0, |s| s.0))
                .collect(),
            v_scale: (0..num_layers)
                .map(|l| scales.get(l).map_or(1.0, |s| s.1))
                .collect(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> KvCacheDtype {
        self.dtype
    }

    /// Physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The slot of logical position `pos` under `block_table`.
    ///
    /// # Errors
    /// When the table does not cover `pos` or names a block out of range.
    #[inline]
    pub fn slot(&self, block_table: &[u32], pos: usize) -> anyhow::Result<usize> {
        let b = *block_table.get(pos / self.block_size).ok_or_else(|| {
            anyhow::anyhow!(
                "block table of {} blocks does not cover position {pos}",
                block_table.len()
            )
        })? as usize;
        anyhow::ensure!(b < self.num_blocks, "block {b} out of range");
        Ok(b * self.block_size + pos % self.block_size)
    }

    /// Store one token's K and V rows (kv_dim each) of `layer` at `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (ks, vs) = (self.k_scale[layer], self.v_scale[layer]);
        for (data, row, s) in [(&mut self.k[layer], k, ks), (&mut self.v[layer], v, vs)] {
            match data {
                KvData::Bf16(buf) => {
                    for (o, x) in buf[slot * d..(slot + 1) * d].iter_mut().zip(row) {
                        *o = half::bf16::from_f32(*x).to_bits();
                    }
                }
                KvData::Fp8(buf) => {
                    let inv = 1.0 / s;
                    for (o, x) in buf[slot * d..(slot + 1) * d].iter_mut().zip(row) {
                        *o = e4m3::encode(x * inv);
                    }
                }
            }
        }
    }

    /// Gather positions `0..len` of `layer` under `block_table` into contiguous f32 `[len,
    /// kv_dim]` buffers (dequantized).
    ///
    /// # Errors
    /// When the table does not cover `len` positions.
    pub fn gather(
        &self,
        layer: usize,
        block_table: &[u32],
        len: usize,
        k_out: &mut Vec<f32>,
        v_out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let d = self.kv_dim;
        k_out.resize(len * d, 0.0);
        v_out.resize(len * d, 0.0);
        let (ks, vs) = (self.k_scale[layer], self.v_scale[layer]);
        for (data, out, s) in [
            (&self.k[layer], &mut *k_out, ks),
            (&self.v[layer], &mut *v_out, vs),
        ] {
            let mut pos = 0;
            while pos < len {
                let slot = self.slot(block_table, pos)?;
                let run = (self.block_size - pos % self.block_size).min(len - pos);
                let dst = &mut out[pos * d..(pos + run) * d];
                match data {
                    KvData::Bf16(buf) => {
                        for (o, b) in dst.iter_mut().zip(&buf[slot * d..(slot + run) * d]) {
                            *o = f32::from_bits((*b as u32) << 16);
                        }
                    }
                    KvData::Fp8(buf) => {
                        for (o, b) in dst.iter_mut().zip(&buf[slot * d..(slot + run) * d]) {
                            *o = e4m3::decode(*b) * s;
                        }
                    }
                }
                pos += run;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::prefix_cache::extend_block_hashes;

    #[test]
    fn capacity_line_and_errors() {
        let c = ModelConfig::tiny();
        // tiny: 2 layers · 2 KV heads · 16 dims · 2 (K, V) · 2 bytes = 256 B/token.
        assert_eq!(kv_bytes_per_block(&c, 16, KvCacheDtype::Bf16), 256 * 16);
        assert_eq!(kv_bytes_per_block(&c, 16, KvCacheDtype::Fp8), 128 * 16);
        let cap = KvCapacity::from_budget(&c, 16, KvCacheDtype::Bf16, 256 << 20, 32768).unwrap();
        assert_eq!(cap.num_blocks, 65536);
        assert_eq!(
            cap.line(),
            "KV cache: 1,048,576 tokens (65,536 blocks × 16); max concurrency at 32,768 tokens: 32.0x"
        );
        let e = KvCapacity::from_budget(&c, 16, KvCacheDtype::Bf16, 1 << 20, 32768).unwrap_err();
        assert!(
            e.contains("--kv-cache-memory") && e.contains("--max-model-len"),
            "{e}"
        );
        // 1 MiB holds 256 blocks = 4,096 tokens: lowering --max-model-len is the other way out.
        assert!(e.contains("lower --max-model-len to at most 4,096"), "{e}");
        // 1 KiB holds no block: only raising the budget helps; never "at most 0".
        let e = KvCapacity::from_budget(&c, 16, KvCacheDtype::Bf16, 1 << 10, 32768).unwrap_err();
        assert!(
            !e.contains("at most 0") && !e.contains("lower --max-model-len"),
            "{e}"
        );
        assert!(
            e.contains("raise --kv-cache-memory to at least 8.0 MiB (8,388,608 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn pool_alloc_free_and_lru_eviction() {
        let mut p = BlockPool::new(4, 4, true);
        let a: Vec<u32> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(p.num_free(), 1);
        assert!((p.usage() - 0.75).abs() < 1e-12);
        let toks: Vec<u32> = (0..12).collect();
        let mut hs = Vec::new();
        extend_block_hashes(&mut hs, &toks, 4);
        for (b, h) in a.iter().zip(&hs) {
            p.cache_block(*b, *h);
        }
        p.free(&a);
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.usage(), 0.0);
        // The prefix is still there after freeing.
        assert_eq!(p.lookup(&hs), a);
        // Touching a free cached block takes it off the free queue.
        p.touch(a[0]);
        assert_eq!(p.num_free(), 3);
        assert_eq!(p.count_free(&a), 2);
        // Allocation evicts the never-cached block first, then the tail of the prefix.
        let x = p.allocate().unwrap();
        assert!(!a.contains(&x));
        let y = p.allocate().unwrap();
        assert_eq!(y, a[2], "tail block evicted first");
        assert_eq!(p.lookup(&hs), vec![a[0], a[1]]);
        p.reset_prefix_cache();
        assert!(p.lookup(&hs).is_empty());
        assert_eq!(p.num_cached(), 0);
    }

    #[test]
    fn store_round_trip_bf16_and_fp8() {
        for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Fp8] {
            let mut s = PagedKvStore::new(1, 4, 3, 2, dtype, &[(0.5, 2.0)]);
            let table = [2u32, 0];
            let rows: Vec<[f32; 4]> = (0..3).map(|i| [i as f32, 0.25, -1.5, 3.0]).collect();
            for (pos, r) in rows.iter().enumerate() {
                let slot = s.slot(&table, pos).unwrap();
                s.write(0, slot, r, &r.map(|x| -x));
            }
            assert_eq!(s.slot(&table, 2).unwrap(), 0);
            assert!(s.slot(&table, 4).is_err());
            let (mut k, mut v) = (Vec::new(), Vec::new());
            s.gather(0, &table, 3, &mut k, &mut v).unwrap();
            for (pos, r) in rows.iter().enumerate() {
                for j in 0..4 {
                    // All values are exact in BF16 and in E4M3 at these scales.
                    assert_eq!(k[pos * 4 + j], r[j], "{dtype:?}");
                    assert_eq!(v[pos * 4 + j], -r[j], "{dtype:?}");
                }
            }
        }
    }
}
