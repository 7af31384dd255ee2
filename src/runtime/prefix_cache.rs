//! Prefix caching by hashing full KV blocks, as vLLM V1's automatic prefix caching does: the
//! hash of block `i` covers the hash of block `i-1` and the block's token ids, so equal hashes
//! mean equal whole prefixes. A map from hash to physical block lets a new request reuse the
//! blocks of any earlier request with the same prefix while those blocks are not evicted.
//!
//! Hashes are 64-bit SipHash-1-3 (`std`'s `DefaultHasher` with fixed keys): deterministic within
//! a process; a collision (probability about n²/2⁶⁵ for n cached blocks) would reuse a wrong
//! block, an accepted risk as in vLLM's non-cryptographic default.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The chained hash of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

/// Hash of a block given its parent's hash (None for the first block) and its tokens.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.map(|p| p.0).unwrap_or(0x0005_EED0_FB10).hash(&mut h);
    tokens.hash(&mut h);
    BlockHash(h.finish())
}

/// Extend `hashes` to cover every full block of `tokens` (block size `bs`).
pub fn extend_block_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], bs: usize) {
    let full = tokens.len() / bs;
    while hashes.len() < full {
        let i = hashes.len();
        let parent = hashes.last().copied();
        hashes.push(hash_block(parent, &tokens[i * bs..(i + 1) * bs]));
    }
}

/// Token-level counters, as vLLM's `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`:
/// queried tokens (the prompt length of each admitted request) and tokens served from cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Of those, tokens found in cache.
    pub hits: u64,
}

/// The hash → block map and each block's registered hash.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    map: HashMap<BlockHash, u32>,
    block_hash: Vec<Option<BlockHash>>,
}

impl PrefixCache {
    /// An empty cache for `num_blocks` physical blocks.
    pub fn new(num_blocks: usize) -> Self {
        PrefixCache {
            map: HashMap::new(),
            block_hash: vec![None; num_blocks],
        }
    }

    /// Physical blocks of the longest cached prefix of `hashes`.
    pub fn lookup(&self, hashes: &[BlockHash]) -> Vec<u32> {
        let mut out = Vec::new();
        for h in hashes {
            match self.map.get(h) {
                Some(b) => out.push(*b),
                None => break,
            }
        }
        out
    }

    /// Register `block` as holding the prefix `hash` (a no-op when that hash already has a
    /// block or `block` already has a hash).
    pub fn insert(&mut self, block: u32, hash: BlockHash) {
        if self.block_hash[block as usize].is_some() || self.map.contains_key(&hash) {
            return;
        }
        self.map.insert(hash, block);
        self.block_hash[block as usize] = Some(hash);
    }

    /// Forget `block`'s hash (it is being reused for other tokens).
    pub fn evict(&mut self, block: u32) {
        if let Some(h) = self.block_hash[block as usize].take() {
            if self.map.get(&h) == Some(&block) {
                self.map.remove(&h);
            }
        }
    }

    /// Whether `block` holds a registered prefix.
    pub fn is_cached(&self, block: u32) -> bool {
        self.block_hash[block as usize].is_some()
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.map.clear();
        self.block_hash.iter_mut().for_each(|h| *h = None);
    }

    /// Blocks currently registered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no block is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_over_the_prefix() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[3] = 99; // differs in block 0 only
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        extend_block_hashes(&mut ha, &a, 16);
        extend_block_hashes(&mut hb, &b, 16);
        assert_eq!(ha.len(), 2, "only full blocks are hashed");
        // Block 1's tokens are equal, but its hash differs because the prefix differs.
        assert_ne!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        let mut again = Vec::new();
        extend_block_hashes(&mut again, &a[..20], 16);
        extend_block_hashes(&mut again, &a, 16);
        assert_eq!(again, ha);
    }

    #[test]
    fn lookup_insert_evict_reset() {
        let mut c = PrefixCache::new(8);
        let hs = [BlockHash(1), BlockHash(2), BlockHash(3)];
        c.insert(5, hs[0]);
        c.insert(6, hs[1]);
        assert_eq!(c.lookup(&hs), vec![5, 6]);
        c.insert(7, hs[0]); // duplicate hash: ignored
        assert!(!c.is_cached(7));
        c.evict(5);
        assert!(c.lookup(&hs).is_empty());
        assert_eq!(c.len(), 1);
        c.reset();
        assert!(c.is_empty() && !c.is_cached(6));
    }
}
