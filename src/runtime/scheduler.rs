//! The continuous-batching scheduler (Yu et al., "Orca", OSDI 2022; vLLM V1's `Scheduler`):
//! every step spends a token budget (`max_num_batched_tokens`) first on running sequences (one
//! decode token plus its drafts, or the next prefill chunk), then admits waiting sequences while
//! KV blocks and `max_num_seqs` allow. When a running sequence cannot get a block, the most
//! recently admitted sequence is preempted by recompute: its blocks are freed, it returns to the
//! front of the queue and will be prefilled again (its generated tokens kept). Nothing is ever
//! dropped.

use std::collections::VecDeque;

use super::backend::{ForwardBatch, SeqSegment};
use super::kv_cache::BlockPool;
use super::prefix_cache::{extend_block_hashes, BlockHash, PrefixCacheStats};

/// Scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Token budget per step.
    pub max_num_batched_tokens: usize,
}

/// One sequence's scheduling state.
#[derive(Debug, Clone)]
pub struct Seq {
    /// Request id.
    pub id: u64,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub num_prompt: usize,
    /// Tokens whose K/V are in the cache (a prefix of `tokens`).
    pub num_computed: usize,
    /// Physical blocks, in logical order.
    pub block_table: Vec<u32>,
    /// Chained hashes of the full blocks of `tokens`.
    pub block_hashes: Vec<BlockHash>,
    /// Leading blocks registered in the prefix cache.
    pub num_cached_blocks: usize,
    /// Draft tokens to verify next step.
    pub drafts: Vec<u32>,
    /// Times preempted.
    pub num_preemptions: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub num_cached_tokens: usize,
    /// Recurrent-state slot while running (Gated-DeltaNet hybrids; one of `max_num_seqs`,
    /// [`Seq::NO_SLOT`] while waiting).
    pub state_slot: u32,
    /// Every prompt position needs its logit row (prompt log-probabilities): the prompt is
    /// computed in full, never taken from the prefix cache.
    pub prompt_logits: bool,
}

impl Seq {
    /// A new waiting sequence.
    pub fn new(id: u64, prompt: Vec<u32>) -> Self {
        Seq {
            id,
            num_prompt: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            block_table: Vec::new(),
            block_hashes: Vec::new(),
            num_cached_blocks: 0,
            drafts: Vec::new(),
            num_preemptions: 0,
            num_cached_tokens: 0,
            state_slot: Self::NO_SLOT,
            prompt_logits: false,
        }
    }

    /// [`Seq::state_slot`] of a sequence that holds none.
    pub const NO_SLOT: u32 = u32::MAX;

    /// Generated tokens.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt..]
    }

    /// Whether the next step computes the last token (decode), as opposed to a prefill chunk.
    pub fn is_decoding(&self) -> bool {
        self.num_computed + 1 == self.tokens.len()
    }
}

/// What one sequence does in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// Request id.
    pub id: u64,
    /// Position of the first token computed.
    pub first_pos: usize,
    /// Committed tokens computed this step (prefill chunk, or the last token).
    pub num_tokens: usize,
    /// Drafts verified this step (their logits are produced too).
    pub drafts: Vec<u32>,
    /// Whether the step reaches the last committed token, producing `1 + drafts` logit rows.
    pub samples: bool,
}

/// The scheduler and the KV block pool it manages.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    /// Free recurrent-state slots (`max_num_seqs` of them in all): a running sequence holds
    /// one, so the running count never exceeds the slots a hybrid's backend allocated.
    free_slots: Vec<u32>,
    /// Preemptions so far.
    pub num_preemptions: u64,
    /// Prefix-cache counters so far.
    pub prefix_stats: PrefixCacheStats,
}

impl Scheduler {
    /// A scheduler over `pool`.
    pub fn new(config: SchedulerConfig, pool: BlockPool) -> Self {
        Scheduler {
            config,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_slots: (0..config.max_num_seqs as u32).rev().collect(),
            num_preemptions: 0,
            prefix_stats: PrefixCacheStats::default(),
        }
    }

    /// Queue a sequence.
    pub fn add(&mut self, seq: Seq) {
        self.waiting.push_back(seq);
    }

    /// Remove a sequence wherever it is and free its blocks; returns it if it existed.
    pub fn remove(&mut self, id: u64) -> Option<Seq> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
            self.pool.free(&s.block_table);
            self.release_slot(&mut s);
            return Some(s);
        }
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let s = self.waiting.remove(i)?;
            self.pool.free(&s.block_table);
            return Some(s);
        }
        None
    }

    /// Running sequences.
    pub fn running(&self) -> &[Seq] {
        &self.running
    }

    /// Mutable access to running sequences (to set drafts).
    pub fn running_mut(&mut self) -> &mut [Seq] {
        &mut self.running
    }

    /// A running sequence.
    pub fn get(&self, id: u64) -> Option<&Seq> {
        self.running.iter().find(|s| s.id == id)
    }

    /// Waiting sequences (including preempted ones).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Id of the sequence at the head of the queue.
    pub fn first_waiting(&self) -> Option<u64> {
        self.waiting.front().map(|s| s.id)
    }

    /// Whether there is anything to do.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// The block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Forget all cached prefixes.
    pub fn reset_prefix_cache(&mut self) {
        self.pool.reset_prefix_cache();
        for s in &mut self.running {
            // Their full blocks are no longer registered; they may register again as they grow.
            s.num_cached_blocks = 0;
        }
    }

    /// Blocks needed to cover `n` positions.
    fn blocks_for(&self, n: usize) -> usize {
        n.div_ceil(self.pool.block_size())
    }

    fn release_slot(&mut self, s: &mut Seq) {
        if s.state_slot != Seq::NO_SLOT {
            self.free_slots.push(s.state_slot);
            s.state_slot = Seq::NO_SLOT;
        }
    }

    fn preempt_last(&mut self) -> Option<u64> {
        let mut s = self.running.pop()?;
        self.pool.free(&s.block_table);
        // The state restarts with the recomputation (its first segment is at position 0).
        self.release_slot(&mut s);
        s.block_table.clear();
        s.num_computed = 0;
        s.num_cached_blocks = 0;
        s.drafts.clear();
        s.num_preemptions += 1;
        self.num_preemptions += 1;
        let id = s.id;
        self.waiting.push_front(s);
        Some(id)
    }

    /// Plan one step. Allocates the blocks the planned tokens need.
    pub fn schedule(&mut self) -> Vec<Scheduled> {
        let mut budget = self.config.max_num_batched_tokens;
        let mut out = Vec::new();
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (first_pos, remaining, ndrafts) = {
                let s = &self.running[i];
                (
                    s.num_computed,
                    s.tokens.len() - s.num_computed,
                    s.drafts.len(),
                )
            };
            if remaining == 0 {
                i += 1;
                continue;
            }
            let num_tokens = remaining.min(budget);
            let reaches_end = num_tokens == remaining;
            let mut drafts = if reaches_end {
                ndrafts.min(budget - num_tokens)
            } else {
                0
            };
            let mut scheduled_self = true;
            loop {
                let need = self
                    .blocks_for(first_pos + num_tokens + drafts)
                    .saturating_sub(self.running[i].block_table.len());
                if need <= self.pool.num_free() {
                    for _ in 0..need {
                        if let Some(b) = self.pool.allocate() {
                            self.running[i].block_table.push(b);
                        }
                    }
                    break;
                }
                if drafts > 0 {
                    drafts = 0;
                    continue;
                }
                preempted = true;
                let victim = self.preempt_last();
                if victim.is_none() || i >= self.running.len() {
                    // The sequence preempted itself.
                    scheduled_self = false;
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            let s = &mut self.running[i];
            s.drafts.truncate(drafts);
            out.push(Scheduled {
                id: s.id,
                first_pos,
                num_tokens,
                drafts: s.drafts.clone(),
                samples: reaches_end,
            });
            budget -= num_tokens + drafts;
            i += 1;
        }
        if preempted {
            return out;
        }
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(s) = self.waiting.front_mut() else {
                break;
            };
            let bs = self.pool.block_size();
            extend_block_hashes(&mut s.block_hashes, &s.tokens, bs);
            // Hits: full blocks, never the whole sequence (its last token needs computing).
            let max_hit_blocks = (s.tokens.len() - 1) / bs;
            let hits: Vec<u32> = if s.block_table.is_empty() && !s.prompt_logits {
                let mut h = self.pool.lookup(&s.block_hashes);
                h.truncate(max_hit_blocks);
                h
            } else {
                Vec::new()
            };
            let computed = s.num_computed.max(hits.len() * bs);
            let remaining = s.tokens.len() - computed;
            let num_tokens = remaining.min(budget);
            let total_blocks = (computed + num_tokens).div_ceil(bs);
            let have = s.block_table.len().max(hits.len());
            let need = total_blocks.saturating_sub(have);
            let free_after_touch = self.pool.num_free() - self.pool.count_free(&hits);
            if need > free_after_touch {
                break;
            }
            if self.free_slots.is_empty() {
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            s.state_slot = self.free_slots.pop().unwrap_or(Seq::NO_SLOT);
            for &b in &hits {
                self.pool.touch(b);
            }
            if !hits.is_empty() {
                s.block_table = hits.clone();
                s.num_cached_blocks = hits.len();
                s.num_computed = hits.len() * bs;
            }
            for _ in 0..need {
                if let Some(b) = self.pool.allocate() {
                    s.block_table.push(b);
                }
            }
            if s.num_preemptions == 0 {
                self.prefix_stats.queries += s.num_prompt as u64;
                let hit_tokens = (hits.len() * bs).min(s.num_prompt);
                self.prefix_stats.hits += hit_tokens as u64;
                s.num_cached_tokens = hit_tokens;
            }
            out.push(Scheduled {
                id: s.id,
                first_pos: s.num_computed,
                num_tokens,
                drafts: Vec::new(),
                samples: num_tokens == remaining,
            });
            budget -= num_tokens;
            self.running.push(s);
        }
        out
    }

    /// Logit rows a planned step produces for its sequence: `1 + drafts` when it samples, none
    /// for a prefill chunk that does not reach the end; every position of a chunk that computes
    /// prompt tokens of a [`Seq::prompt_logits`] sequence (the last one samples when the chunk
    /// reaches the end).
    pub fn logit_rows(&self, p: &Scheduled) -> usize {
        match self.get(p.id) {
            Some(s) if s.prompt_logits && p.first_pos < s.num_prompt => {
                p.num_tokens + if p.samples { p.drafts.len() } else { 0 }
            }
            _ if p.samples => 1 + p.drafts.len(),
            _ => 0,
        }
    }

    /// The forward batch of a plan.
    pub fn batch(&self, plan: &[Scheduled]) -> ForwardBatch {
        let mut b = ForwardBatch::default();
        for p in plan {
            let Some(s) = self.get(p.id) else { continue };
            let start = b.token_ids.len();
            b.token_ids
                .extend_from_slice(&s.tokens[p.first_pos..p.first_pos + p.num_tokens]);
            b.token_ids.extend_from_slice(&p.drafts);
            b.seqs.push(SeqSegment {
                start,
                len: p.num_tokens + p.drafts.len(),
                first_pos: p.first_pos,
                block_table: s.block_table.clone(),
                num_logits: self.logit_rows(p),
                state_slot: s.state_slot,
            });
        }
        b
    }

    /// Record a step's result for one sequence: `computed` more tokens now have K/V in the
    /// cache (the scheduled committed tokens plus accepted drafts) and `new_tokens` were
    /// appended. Registers newly full blocks in the prefix cache.
    pub fn commit(&mut self, id: u64, computed: usize, new_tokens: &[u32]) {
        let bs = self.pool.block_size();
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return;
        };
        let s = &mut self.running[i];
        s.num_computed += computed;
        s.tokens.extend_from_slice(new_tokens);
        s.drafts.clear();
        if !self.pool.prefix_caching() {
            return;
        }
        let full = (s.num_computed / bs).min(s.block_table.len());
        extend_block_hashes(&mut s.block_hashes, &s.tokens[..full * bs], bs);
        let (from, table, hashes) = (
            s.num_cached_blocks,
            s.block_table.clone(),
            s.block_hashes.clone(),
        );
        s.num_cached_blocks = full.max(from);
        for j in from..full {
            self.pool.cache_block(table[j], hashes[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(blocks: usize, seqs: usize, budget: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: seqs,
                max_num_batched_tokens: budget,
            },
            BlockPool::new(blocks, 4, true),
        )
    }

    /// Run the plan as if the model produced token 7 for every sampled sequence.
    fn step(s: &mut Scheduler) -> Vec<Scheduled> {
        let plan = s.schedule();
        for p in &plan {
            if p.samples {
                s.commit(p.id, p.num_tokens, &[7]);
            } else {
                s.commit(p.id, p.num_tokens, &[]);
            }
        }
        plan
    }

    #[test]
    fn chunked_prefill_respects_budget() {
        let mut s = sched(16, 4, 6);
        s.add(Seq::new(1, (0..10).collect()));
        let p = step(&mut s);
        assert_eq!(
            p,
            vec![Scheduled {
                id: 1,
                first_pos: 0,
                num_tokens: 6,
                drafts: vec![],
                samples: false
            }]
        );
        let p = step(&mut s);
        assert_eq!(
            (p[0].first_pos, p[0].num_tokens, p[0].samples),
            (6, 4, true)
        );
        let p = step(&mut s);
        assert_eq!(
            (p[0].first_pos, p[0].num_tokens, p[0].samples),
            (10, 1, true)
        );
        assert_eq!(s.get(1).unwrap().tokens.len(), 12);
    }

    #[test]
    fn queues_when_full_and_admits_when_freed() {
        // 4 blocks of 4 = 16 slots; each sequence has 7 prompt tokens -> 2 blocks.
        let mut s = sched(4, 8, 100);
        for id in 0..3 {
            s.add(Seq::new(id, (0..7).map(|t| t + 10 * id as u32).collect()));
        }
        let p = step(&mut s);
        assert_eq!(p.len(), 2, "only two fit");
        assert_eq!(s.num_waiting(), 1);
        s.remove(0);
        let p = step(&mut s);
        assert!(p.iter().any(|x| x.id == 2), "admitted after a free: {p:?}");
        assert_eq!(s.num_waiting(), 0);
    }

    #[test]
    fn preempts_the_newest_when_blocks_run_out() {
        let mut s = sched(4, 8, 100);
        s.add(Seq::new(1, (0..8).collect()));
        s.add(Seq::new(2, (20..28).collect()));
        step(&mut s); // both prefilled: 2 blocks each, all 4 used; both sampled token 7
        assert_eq!(s.pool().num_free(), 0);
        let p = step(&mut s); // seq 1 needs a 3rd block: seq 2 is preempted
        assert_eq!(s.num_preemptions, 1);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].id, 1);
        assert_eq!(s.num_waiting(), 1);
        // The preempted sequence keeps its output and is recomputed later.
        s.remove(1);
        let p = step(&mut s);
        assert_eq!(p[0].id, 2);
        // Its first block survived in the prefix cache (the tail block was evicted first), so
        // recompute starts at position 4 and covers the rest of prompt + generated token.
        assert_eq!((p[0].first_pos, p[0].num_tokens), (4, 5));
    }

    /// Every running sequence holds its own state slot, one of `max_num_seqs`; slots come back
    /// when a sequence finishes or is preempted, and the batch carries them.
    #[test]
    fn running_sequences_hold_distinct_state_slots() {
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 2,
                max_num_batched_tokens: 100,
            },
            BlockPool::new(6, 4, false),
        );
        for id in 0..3 {
            s.add(Seq::new(id, (0..8).map(|t| t + 10 * id as u32).collect()));
        }
        let plan = step(&mut s);
        assert_eq!(
            plan.len(),
            2,
            "two slots: the third waits although blocks are free"
        );
        let slots: Vec<u32> = s.running().iter().map(|q| q.state_slot).collect();
        assert_eq!(slots, vec![0, 1]);
        // Sequence 0 finishes: its slot goes to sequence 2, which starts at position 0.
        s.remove(0);
        let plan = s.schedule();
        let b = s.batch(&plan);
        assert_eq!(s.get(2).unwrap().state_slot, 0);
        assert!(b
            .seqs
            .iter()
            .any(|g| g.state_slot == 0 && g.first_pos == 0 && g.len == 8));
        assert!(b.seqs.iter().any(|g| g.state_slot == 1 && g.first_pos == 8));
        for p in &plan {
            s.commit(p.id, p.num_tokens, &[7]);
        }
        // Blocks run out: the newest is preempted and gives its slot back.
        for _ in 0..16 {
            if s.num_preemptions > 0 {
                break;
            }
            step(&mut s);
        }
        assert_eq!(s.num_preemptions, 1);
        assert_eq!(s.running().len(), 1);
        assert_eq!(s.running()[0].state_slot, 1);
        assert_eq!(s.free_slots, vec![0]);
    }

    #[test]
    fn prefix_hits_are_counted_in_tokens_and_reused() {
        let mut s = sched(16, 8, 100);
        let prompt: Vec<u32> = (0..10).collect();
        s.add(Seq::new(1, prompt.clone()));
        step(&mut s);
        s.remove(1);
        assert_eq!(
            s.prefix_stats,
            PrefixCacheStats {
                queries: 10,
                hits: 0
            }
        );
        s.add(Seq::new(2, prompt.clone()));
        let p = step(&mut s);
        // Two full blocks (8 tokens) are reused; 2 tokens computed.
        assert_eq!((p[0].first_pos, p[0].num_tokens), (8, 2));
        assert_eq!(
            s.prefix_stats,
            PrefixCacheStats {
                queries: 20,
                hits: 8
            }
        );
        assert_eq!(s.get(2).unwrap().num_cached_tokens, 8);
        s.remove(2);
        // A prompt of exactly 8 tokens may hit only 1 block: its last token must be computed.
        s.add(Seq::new(3, prompt[..8].to_vec()));
        let p = step(&mut s);
        assert_eq!((p[0].first_pos, p[0].num_tokens), (4, 4));
        s.remove(3);
        s.reset_prefix_cache();
        s.add(Seq::new(4, prompt));
        let p = step(&mut s);
        assert_eq!(p[0].first_pos, 0);
    }

    #[test]
    fn drafts_are_scheduled_and_dropped_before_preempting() {
        let mut s = sched(3, 8, 100);
        s.add(Seq::new(1, (0..7).collect()));
        step(&mut s); // 8 tokens, 2 blocks
        s.running_mut()[0].drafts = vec![1, 2, 3];
        let p = s.schedule();
        assert_eq!(p[0].drafts, vec![1, 2, 3]);
        assert_eq!(s.batch(&p).num_logits(), 4);
        s.commit(1, 1 + 3, &[1, 2, 3, 9]); // all accepted: 12 tokens, 11 computed
        s.running_mut()[0].drafts = vec![4, 5, 6];
        // 11 + 1 + 3 = 15 positions > 12 slots: drafts dropped, no preemption.
        let p = s.schedule();
        assert!(p[0].drafts.is_empty());
        assert_eq!(s.num_preemptions, 0);
    }
}
