//! Orchestration of the multi-GPU parts inside `rigbench kernels` / `report`: the kernel suite on
//! every selected GPU at once ([`bench_devices`]), the interconnect ([`interconnect`]) and the
//! tensor-parallel prediction ([`tp_prediction`]). GPU work runs on threads of its own, with a
//! deadline, so a hung or crashing library call costs that part, not the report.

use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::kernels::bench::BenchOptions;
use crate::kernels::peers::PeerMode;
use crate::kernels::suite::ModelInfo;
use crate::kernels::KernelResults;
use crate::multigpu::allreduce::AllReduceOptions;
use crate::multigpu::p2p::P2pOptions;
use crate::multigpu::schema::{AllReduceResults, DeviceKernels, MultiGpuResults, TpPrediction};
use crate::report::{Results, Skip};

/// The longest one interconnect measurement (all pairs' copies, or one communicator's
/// all-reduces) may take before it is abandoned and recorded as skipped.
pub const PART_DEADLINE: Duration = Duration::from_secs(180);

/// Run `f` on a new thread; its panic or a run past `deadline` becomes an error naming `what`.
pub fn in_thread<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("rigbench {what}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        return Err(format!("{what}: could not start a thread: {e}"));
    }
    match rx.recv_timeout(deadline) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(p)) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("{what} failed inside a library call: {msg}"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "{what} did not finish within {} s and was abandoned",
            deadline.as_secs()
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(format!("{what} stopped without a result"))
        }
    }
}

/// Why the multi-GPU parts do not run, or `None` when `devices` has two or more GPUs.
pub fn single_gpu_reason(
    selected: &[usize],
    available: usize,
    absent: Option<&str>,
) -> Option<String> {
    if selected.len() > 1 {
        return None;
    }
    Some(match (available, absent) {
        (0, Some(why)) => format!("no GPU ({why}): nothing to compare, no interconnect to measure"),
        (0, None) => "no GPU: nothing to compare, no interconnect to measure".into(),
        (1, _) => "one GPU on this machine: no per-GPU spread, interconnect or measured all-reduce (the tensor-parallel composite is predicted from this GPU's rows and a stated all-reduce model instead)".into(),
        (n, _) => format!(
            "one GPU selected of the {n} on this machine; `--devices all` benches all {n} at once, measures the interconnect and predicts tensor-parallel decode"
        ),
    })
}

/// Bench the other devices (`others`) at the same time as `first`, which `run_first` benches on
/// the calling thread (it gets a callback to read the others' progress). Returns the others'
/// results in the order given.
pub fn bench_devices<R>(
    opts: &BenchOptions,
    others: &[(usize, String)],
    run_first: impl FnOnce(&dyn Fn() -> Vec<DeviceKernels>) -> R,
) -> (R, Vec<DeviceKernels>) {
    let shared: Mutex<Vec<DeviceKernels>> = Mutex::new(
        others
            .iter()
            .map(|(d, name)| DeviceKernels {
                device: *d,
                name: name.clone(),
                ..Default::default()
            })
            .collect(),
    );
    let lock = |m: &Mutex<Vec<DeviceKernels>>| -> Vec<DeviceKernels> {
        m.lock().unwrap_or_else(|p| p.into_inner()).clone()
    };
    let first = std::thread::scope(|s| {
        for (slot, (d, _)) in others.iter().enumerate() {
            let shared = &shared;
            let d = *d;
            s.spawn(move || {
                let store = |f: &dyn Fn(&mut DeviceKernels)| {
                    let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
                    f(&mut g[slot]);
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    crate::kernels::bench::run_on_device(d, opts, |partial: &KernelResults| {
                        store(&|k| k.kernels = Some(partial.clone()));
                    })
                }));
                match r {
                    Ok(Ok(mut k)) => {
                        k.notes.push(format!(
                            "benched on GPU{d} at the same time as the other selected GPUs; peers run on the first selected GPU only"
                        ));
                        store(&|x| x.kernels = Some(k.clone()))
                    }
                    Ok(Err(e)) => store(&|x| {
                        x.error = Some(format!(
                            "the kernel bench stopped: {e:#} (cases measured before the error are kept)"
                        ))
                    }),
                    Err(_) => store(&|x| {
                        x.error = Some("the kernel bench failed inside a library call (cases measured before are kept)".into())
                    }),
                }
            });
        }
        run_first(&|| lock(&shared))
    });
    (first, lock(&shared))
}

/// Measure the interconnect of `devices` (two or more) into `mg`: peer-to-peer copies, NCCL
/// all-reduces over 2, 4, … and all selected GPUs at the decode-step and large sizes, the
/// all-reduce time per decode step, and PyTorch's figures. Parts that cannot run are pushed to
/// `skipped` with the reason; the others still run.
pub fn interconnect(
    devices: &[usize],
    model: Option<&ModelInfo>,
    peers: PeerMode,
    mg: &mut MultiGpuResults,
    skipped: &mut Vec<Skip>,
) {
    let p2p_opts = P2pOptions::default();
    let devs = devices.to_vec();
    let o = p2p_opts.clone();
    match in_thread("peer-to-peer copies", PART_DEADLINE, move || {
        crate::multigpu::p2p::measure_p2p(&devs, &o)
    }) {
        Ok(Ok(p)) => mg.p2p = Some(p),
        Ok(Err(e)) => skipped.push(Skip {
            what: "multi-gpu/p2p".into(),
            reason: format!("{e}"),
        }),
        Err(e) => skipped.push(Skip {
            what: "multi-gpu/p2p".into(),
            reason: e,
        }),
    }

    let ar_opts = AllReduceOptions {
        sizes: crate::multigpu::message_sizes(model.map(|m| m.hidden_size)),
        ..Default::default()
    };
    if model.is_none() {
        mg.notes.push("the suite has no [model] table: all-reduce measured at large sizes only, no decode-step sizes or per-step cost".into());
    }
    let env_notes = crate::gpu::nccl::set_process_env();
    mg.notes.extend(env_notes);
    match crate::gpu::nccl::probe() {
        Err(why) => skipped.push(Skip {
            what: "multi-gpu/allreduce".into(),
            reason: format!("{why}; the peer-to-peer copies ran without it"),
        }),
        Ok((version, library)) => {
            let mut ar = AllReduceResults {
                nccl_version: version,
                library,
                env: crate::gpu::nccl::env_in_effect(),
                op: "BF16 sum (ncclAllReduce, out of place)".into(),
                method: format!(
                    "nccl-tests' method with one process and thread driving every GPU (`-g N`): per size {} warm-up all-reduces, then {} samples, each a run of back-to-back all-reduces (chosen to last about {:.0} ms, {}–{} of them) between stream synchronizations on every GPU, host clock divided by the count; algbw = bytes / median time, busbw = algbw · 2(n−1)/n (nccl-tests doc/PERFORMANCE.md)",
                    ar_opts.warmup,
                    ar_opts.samples,
                    ar_opts.target_sample_s * 1e3,
                    ar_opts.iters.0,
                    ar_opts.iters.1
                ),
                worlds: Vec::new(),
            };
            for w in crate::multigpu::world_sizes(devices.len()) {
                let devs = devices[..w].to_vec();
                let o = ar_opts.clone();
                let r = in_thread(
                    &format!("all-reduce over GPUs {devs:?}"),
                    PART_DEADLINE,
                    move || crate::multigpu::allreduce::measure_allreduce(&devs, &o),
                );
                match r {
                    Ok(Ok(world)) => ar.worlds.push(world),
                    Ok(Err(e)) => skipped.push(Skip {
                        what: format!("multi-gpu/allreduce/{w}"),
                        reason: format!("{e}"),
                    }),
                    Err(e) => skipped.push(Skip {
                        what: format!("multi-gpu/allreduce/{w}"),
                        reason: e,
                    }),
                }
            }
            if let Some(m) = model {
                mg.allreduce_per_step = crate::multigpu::tp::allreduce_per_step(&ar.worlds, m);
            }
            mg.allreduce = Some(ar);
        }
    }

    if peers == PeerMode::Off {
        skipped.push(Skip {
            what: "multi-gpu/peers".into(),
            reason: "not requested (--peers off)".into(),
        });
        return;
    }
    let spec = crate::multigpu::peers::spec(
        devices,
        mg.p2p.as_ref(),
        p2p_opts.warmup,
        p2p_opts.samples,
        mg.allreduce.as_ref(),
        AllReduceOptions::default().warmup,
        AllReduceOptions::default().samples,
    );
    if spec["p2p"].is_null() && spec["allreduce"].is_null() {
        skipped.push(Skip {
            what: "multi-gpu/peers".into(),
            reason: "rigbench measured no transfer, so there is nothing to set beside PyTorch's"
                .into(),
        });
        return;
    }
    mg.peers = Some(crate::multigpu::peers::run(&spec));
}

/// The tensor-parallel prediction from the decode-step composite and the all-reduce time per
/// step measured in this run.
///
/// # Errors
/// Why it cannot be made (no composite, no model dimensions, no all-reduce measured).
pub fn tp_prediction(results: &Results, model: Option<&ModelInfo>) -> Result<TpPrediction, String> {
    let mg = results
        .multi_gpu
        .as_ref()
        .ok_or("no multi-GPU measurement in this run")?;
    let model = model.ok_or("the suite has no [model] table (hidden size, layers)")?;
    if mg.allreduce_per_step.is_empty() {
        return Err("no all-reduce was measured at the decode-step sizes".into());
    }
    let (source, mut composite) = crate::multigpu::tp::decode_composite(results.kernels.as_ref())?;
    // Only the decode batches whose all-reduce was measured (M ≤ 256).
    composite.retain(|c| mg.allreduce_per_step.iter().any(|r| r.m == c.m));
    if composite.is_empty() {
        return Err(
            "the composite has no M at which the all-reduce was measured (decode M = 1…256)".into(),
        );
    }
    Ok(TpPrediction {
        composite_source: source,
        hidden_size: model.hidden_size,
        layers: model.layers,
        allreduces_per_layer: model.allreduces_per_layer,
        rows: crate::multigpu::tp::predict(&composite, &mg.allreduce_per_step),
        leaves_out: crate::multigpu::tp::LEAVES_OUT
            .iter()
            .map(|s| s.to_string())
            .collect(),
    })
}

/// The tensor-parallel composite at TP = 1 and [`crate::multigpu::tp_model::DEFAULT_DEGREES`]
/// predicted from the first GPU's kernel rows (`results.kernels`) with the all-reduce model `ar`
/// (docs/multi-gpu.md, "Tensor-parallel composite from one GPU").
///
/// # Errors
/// Why it cannot be made (no kernel results, no `[model]` table, no composite).
pub fn tp_model(
    results: &Results,
    model: Option<&ModelInfo>,
    ar: &crate::multigpu::tp_model::AllReduceModel,
) -> Result<crate::multigpu::tp_model::TpModel, String> {
    let k = results
        .kernels
        .as_ref()
        .ok_or("no kernel results in this run")?;
    let model = model.ok_or("the suite has no [model] table (hidden size, layers)")?;
    crate::multigpu::tp_model::predict(k, model, ar, &crate::multigpu::tp_model::DEFAULT_DEGREES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_turn_panics_and_hangs_into_reasons() {
        assert_eq!(in_thread("x", Duration::from_secs(5), || 7), Ok(7));
        let e =
            in_thread("probe", Duration::from_secs(5), || -> u8 { panic!("boom") }).unwrap_err();
        assert!(e.contains("probe") && e.contains("boom"), "{e}");
        let e = in_thread("slow part", Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(500));
        })
        .unwrap_err();
        assert!(e.contains("slow part") && e.contains("abandoned"), "{e}");
    }

    #[test]
    fn single_gpu_reasons() {
        assert_eq!(single_gpu_reason(&[0, 1], 2, None), None);
        assert!(single_gpu_reason(&[], 0, Some("no CUDA driver"))
            .unwrap()
            .contains("no CUDA driver"));
        assert!(single_gpu_reason(&[0], 1, None)
            .unwrap()
            .starts_with("one GPU on this machine"));
        assert!(single_gpu_reason(&[0], 2, None)
            .unwrap()
            .contains("--devices all"));
    }

    #[test]
    fn interconnect_without_gpus_records_skips() {
        if crate::gpu::libraries().driver {
            // On a GPU machine this would measure; the device script covers that path.
            let mut mg = MultiGpuResults::default();
            let mut sk = Vec::new();
            interconnect(&[0, 1 << 20], None, PeerMode::Off, &mut mg, &mut sk);
            assert!(sk.iter().any(|s| s.what == "multi-gpu/p2p"), "{sk:?}");
            return;
        }
        let mut mg = MultiGpuResults::default();
        let mut sk = Vec::new();
        interconnect(&[0, 1], None, PeerMode::Off, &mut mg, &mut sk);
        let whats: Vec<&str> = sk.iter().map(|s| s.what.as_str()).collect();
        assert!(whats.contains(&"multi-gpu/p2p"), "{whats:?}");
        assert!(
            whats.iter().any(|w| w.starts_with("multi-gpu/allreduce")),
            "{whats:?}"
        );
        assert!(whats.contains(&"multi-gpu/peers"));
        assert!(mg.p2p.is_none());
        assert!(mg.notes.iter().any(|n| n.contains("[model]")));
        assert_eq!(std::env::var("NCCL_NVLS_ENABLE").as_deref(), Ok("0"));
    }

    #[test]
    fn tp_prediction_names_what_is_missing() {
        let r = Results::new(Default::default(), "x".into(), "c".into());
        assert!(tp_prediction(&r, None)
            .unwrap_err()
            .contains("no multi-GPU"));
        let mut r = r;
        r.multi_gpu = Some(MultiGpuResults::default());
        assert!(tp_prediction(&r, None).unwrap_err().contains("[model]"));
        let m = ModelInfo {
            name: "m".into(),
            hidden_size: 8,
            layers: 2,
            allreduces_per_layer: 2,
        };
        assert!(tp_prediction(&r, Some(&m))
            .unwrap_err()
            .contains("decode-step sizes"));
    }
}
