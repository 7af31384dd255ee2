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
