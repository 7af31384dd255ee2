//! Per-op GPU time of eager forward passes, from CUDA events around each launch group
//! ([`CudaBackend::set_profiling`], [`CudaBackend::profile`]).

use super::CudaBackend;

impl CudaBackend {
    /// Profile forward passes per op (CUDA events around every launch group; turns CUDA graphs
    /// off, since a replay cannot be split). [`CudaBackend::profile`] reads the totals.
    ///
    /// # Errors
    /// Creating the events fails.
    pub fn set_profiling(&mut self, on: bool) -> anyhow::Result<()> {
        if on {
            self.set_cuda_graphs(false);
            let mut timers = Vec::new();
            for _ in 0..(16 * self.config.num_layers + 32) {
                timers.push(self.gpu.timer()?);
            }
            self.prof = Some(Profiler {
                timers,
                used: Vec::new(),
                totals: Default::default(),
            });
        } else {
            self.prof = None;
        }
        Ok(())
    }

    /// Per-op totals since profiling started: (op, calls, seconds), largest first.
    pub fn profile(&self) -> Vec<(String, u64, f64)> {
        let mut v: Vec<(String, u64, f64)> = self
            .prof
            .as_ref()
            .map(|p| {
                p.totals
                    .iter()
                    .map(|(k, (n, s))| (k.to_string(), *n, *s))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// Bytes one batch-1 decode step at a context of `context` positions must move for each op
    /// the profile names, where the op has a byte floor: the GEMMs (their weights, all layers),
    /// attention (K and V of every attended position, all attention layers) and, for hybrids,
    /// the Gated-DeltaNet state read and written per step (`gdn::op_bytes`). Other ops are left
    /// out (activations only).
    pub fn op_bytes(&self, context: usize) -> Vec<(&'static str, u64)> {
        let sum = |f: &dyn Fn(&super::DLayer) -> usize| -> u64 {
            self.weights.layers.iter().map(|l| f(l) as u64).sum()
        };
        let c = &self.config;
        let kv = (2 * c.num_attention_layers() * context * c.num_kv_heads * c.head_dim) as u64
            * self.kv_elem() as u64;
        let head = self
            .weights
            .lm_head
            .as_ref()
            .unwrap_or(&self.weights.embed)
            .bytes() as u64;
        let common = [
            ("GEMM gate_up", sum(&|l| l.gate_up.bytes())),
            ("GEMM down", sum(&|l| l.down.bytes())),
            ("attention", kv),
            ("GEMM lm_head (FP32 logits)", head),
        ];
        if self.hy.is_some() {
            let mut v = super::gdn::op_bytes(self);
            v.push(("GEMM o_proj / out_proj", sum(&|l| l.o.bytes())));
            v.extend(common);
            return v;
        }
        let mut v = vec![
            ("GEMM qkv", sum(&|l| l.qkv.bytes())),
            ("GEMM o_proj", sum(&|l| l.o.bytes())),
        ];
        v.extend(common);
        v
    }

    /// Bytes of Gated-DeltaNet state one decode step reads and writes (the recurrent and
    /// convolution states of every Gated-DeltaNet layer, each read once and written once; 0 for
    /// dense decoders).
    pub fn state_bytes_per_step(&self) -> u64 {
        2 * crate::runtime::backend::Backend::state_bytes_per_slot(self)
    }

    pub(super) fn op_begin(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            let i = p.used.len();
            if let Some(t) = p.timers.get(i) {
                t.start(&self.gpu)?;
            }
        }
        Ok(())
    }

    pub(super) fn op_end(&mut self, name: &'static str) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            let i = p.used.len();
            if let Some(t) = p.timers.get(i) {
                t.mark_end(&self.gpu)?;
                p.used.push(name);
            }
        }
        Ok(())
    }

    pub(super) fn prof_collect(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.prof {
            for (i, name) in p.used.drain(..).enumerate() {
                let s = p.timers[i].elapsed()?;
                let e = p.totals.entry(name).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += s;
            }
        }
        Ok(())
    }
}

/// Per-op GPU time of forward passes, from CUDA events around each op (timers are reused from a
/// pool; the totals are read after each step).
pub(super) struct Profiler {
    timers: Vec<crate::gpu::Timer>,
    used: Vec<&'static str>,
    totals: std::collections::BTreeMap<&'static str, (u64, f64)>,
}
