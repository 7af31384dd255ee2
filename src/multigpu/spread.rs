//! The same kernel suite on several GPUs: per case the spread between same-model GPUs, per GPU
//! how far it sits from the fastest, and findings for a GPU that is slower at the same clocks or
//! runs at lower clocks (power, thermal).
//!
//! Per GPU the figure is the geometric mean, over the cases every same-model GPU ran, of its
//! median time divided by the fastest GPU's median for that case (1.0 = fastest everywhere); a
//! geometric mean keeps a handful of µs-long cases from hiding or inventing a slow card. Clocks
//! are the SM clocks recorded with each case; a GPU "runs at lower clocks" when its median clock
//! is more than [`CLOCK_LOWER_PCT`] below the fastest-clocked same-model GPU's, or when a harmful
//! throttle reason (power cap, thermal slowdown, …) was seen during its cases.

use std::collections::BTreeMap;

use super::schema::{DeviceSummary, Finding, SpreadReport, SpreadRow};
use crate::kernels::KernelResults;

/// A GPU more than this much slower (geometric mean) than the fastest same-model GPU gets a
/// finding (docs/multi-gpu.md: "more than 5% slower").
pub const SLOWER_PCT: f64 = 5.0;

/// A median SM clock more than this far below the best same-model GPU's counts as lower clocks
/// (one clock step of a Hopper or Ada card is 15 MHz, under 1% of its boost clock).
pub const CLOCK_LOWER_PCT: f64 = 1.0;

/// One device's kernel results, for [`spread`].
pub struct DeviceRun<'a> {
    /// CUDA index.
    pub device: usize,
    /// Name (the model; devices of the same name are compared).
    pub name: &'a str,
    /// What it measured.
    pub kernels: &'a KernelResults,
}

fn median_u32(v: &mut [u32]) -> Option<u32> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

/// Compare the devices' rigbench rows (peer rows are left out: peers run on the first GPU only).
pub fn spread(runs: &[DeviceRun]) -> SpreadReport {
    let mut rep = SpreadReport::default();
    // Devices grouped by model, in first-seen order.
    let mut groups: Vec<(&str, Vec<&DeviceRun>)> = Vec::new();
    for r in runs {
        match groups.iter_mut().find(|(n, _)| *n == r.name) {
            Some(g) => g.1.push(r),
            None => groups.push((r.name, vec![r])),
        }
    }
    for (name, devs) in &groups {
        // (implementation, shape, m) → per device median.
        let mut keyed: BTreeMap<(String, String, usize), Vec<(usize, f64)>> = BTreeMap::new();
        let mut order: Vec<(String, String, usize)> = Vec::new();
        for d in devs {
            for c in d.kernels.cases.iter().filter(|c| c.provider == "rigbench") {
                if !(c.timing.median_s.is_finite() && c.timing.median_s > 0.0) {
                    continue;
                }
                let key = (c.implementation.clone(), c.shape.clone(), c.m);
                if !keyed.contains_key(&key) {
                    order.push(key.clone());
                }
                keyed
                    .entry(key)
                    .or_default()
                    .push((d.device, c.timing.median_s));
            }
        }
        let mut ratios: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        if devs.len() > 1 {
            for key in &order {
                let meds = &keyed[key];
                if meds.len() != devs.len() {
                    continue; // not measured on every same-model GPU
                }
                let min = meds.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
                let max = meds.iter().map(|m| m.1).fold(0.0, f64::max);
                for (d, t) in meds {
                    ratios.entry(*d).or_default().push(t / min);
                }
                rep.rows.push(SpreadRow {
                    implementation: key.0.clone(),
                    shape: key.1.clone(),
                    m: key.2,
                    medians: meds.clone(),
                    spread_pct: (max / min - 1.0) * 100.0,
                });
            }
        }
        let mut summaries = Vec::new();
        for d in devs {
            let mut clocks: Vec<u32> = d
                .kernels
                .cases
                .iter()
                .filter(|c| c.provider == "rigbench")
                .filter_map(|c| c.sm_clock_mhz)
                .collect();
            let mut throttle: Vec<String> = d
                .kernels
                .cases
                .iter()
                .flat_map(|c| c.throttle.iter().cloned())
                .collect();
            throttle.sort();
            throttle.dedup();
            let r = ratios.get(&d.device);
            summaries.push(DeviceSummary {
                device: d.device,
                name: name.to_string(),
                cases: r.map(|v| v.len()).unwrap_or(0),
                geomean_vs_fastest: r
                    .filter(|v| !v.is_empty())
                    .map(|v| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()),
                median_sm_clock_mhz: median_u32(&mut clocks),
                throttle,
            });
        }
        if devs.len() > 1 {
            rep.findings.extend(findings(&summaries));
        }
        rep.devices.extend(summaries);
    }
    rep.devices.sort_by_key(|d| d.device);
    rep
}

/// Findings for one group of same-model devices.
fn findings(group: &[DeviceSummary]) -> Vec<Finding> {
    let mut out = Vec::new();
    let best_clock = group.iter().filter_map(|d| d.median_sm_clock_mhz).max();
    let best_dev = group
        .iter()
        .find(|d| d.median_sm_clock_mhz.is_some() && d.median_sm_clock_mhz == best_clock)
        .map(|d| d.device);
    for d in group {
        let slower_pct = d.geomean_vs_fastest.map(|g| (g - 1.0) * 100.0);
        let lower_clock = match (d.median_sm_clock_mhz, best_clock) {
            (Some(c), Some(b)) => (c as f64) < b as f64 * (1.0 - CLOCK_LOWER_PCT / 100.0),
            _ => false,
        };
        let slow_text = slower_pct
            .map(|p| {
                format!(
                    "its kernels take {p:.1}% longer than the fastest same-model GPU's (geometric mean over {} cases)",
                    d.cases
                )
            })
            .unwrap_or_else(|| "no case was compared".into());
        if lower_clock || !d.throttle.is_empty() {
            let mut why = Vec::new();
            if lower_clock {
                why.push(format!(
                    "median SM clock {} MHz against {} MHz on GPU{}",
                    d.median_sm_clock_mhz.unwrap_or(0),
                    best_clock.unwrap_or(0),
                    best_dev.unwrap_or(0)
                ));
            }
            if !d.throttle.is_empty() {
                why.push(format!("throttle reasons seen: {}", d.throttle.join(", ")));
            }
            out.push(Finding {
                id: "multigpu/lower-clocks".into(),
                severity: "warning".into(),
                device: d.device,
                message: format!(
                    "GPU{} ({}) ran at lower clocks ({}); {slow_text}. Check its power limit, cooling and clock settings (the rig table lists them)",
                    d.device,
                    d.name,
                    why.join("; ")
                ),
            });
        } else if slower_pct.is_some_and(|p| p > SLOWER_PCT) {
            let clocks = match d.median_sm_clock_mhz {
                Some(c) => format!("at the same SM clock ({c} MHz)"),
                None => "with its clocks unknown (no NVML)".into(),
            };
            out.push(Finding {
                id: "multigpu/slower-at-same-clocks".into(),
                severity: "warning".into(),
                device: d.device,
                message: format!(
                    "GPU{} ({}) is more than {SLOWER_PCT}% slower {clocks}: {slow_text}. Not explained by clocks; compare its memory clock, ECC state and PCIe link in the rig table, and re-run to rule out other work on it",
                    d.device, d.name
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::schema::KernelCase;

    /// Built from JSON, so that fields added to the schema with defaults need no change here.
    fn case(imp: &str, shape: &str, m: usize, s: f64, mhz: Option<u32>) -> KernelCase {
        serde_json::from_value(serde_json::json!({
            "provider": "rigbench", "implementation": imp, "format": "bf16", "shape": shape,
            "m": m, "n": 1, "k": 1, "path": "", "check": null,
            "timing": {"samples_s": [s], "median_s": s, "p10_s": s, "p90_s": s, "rel_std": 0.0,
                       "stop_reason": null, "cold_l2": true},
            "extra": [], "derived": {"tflops": 0.0, "weight_bytes": 0, "weight_bytes_per_s": 0.0,
                                     "pct_copy_bw": null, "speedup_vs_bf16": null},
            "sm_clock_mhz": mhz, "throttle": []
        }))
        .expect("a KernelCase")
    }

    fn results(scale: f64, mhz: Option<u32>) -> KernelResults {
        KernelResults {
            cases: vec![
                case("bf16", "o_proj", 1, 20e-6 * scale, mhz),
                case("bf16", "o_proj", 16, 21e-6 * scale, mhz),
                case("w4a16", "gate_up", 1, 60e-6 * scale, mhz),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn equal_gpus_have_no_findings() {
        let a = results(1.0, Some(1980));
        let b = results(1.02, Some(1980));
        let rep = spread(&[
            DeviceRun {
                device: 0,
                name: "H200",
                kernels: &a,
            },
            DeviceRun {
                device: 1,
                name: "H200",
                kernels: &b,
            },
        ]);
        assert_eq!(rep.rows.len(), 3);
        assert!((rep.rows[0].spread_pct - 2.0).abs() < 1e-9);
        assert_eq!(rep.devices[0].geomean_vs_fastest, Some(1.0));
        assert!((rep.devices[1].geomean_vs_fastest.unwrap() - 1.02).abs() < 1e-12);
        assert!(rep.findings.is_empty(), "{:?}", rep.findings);
    }

    #[test]
    fn a_slow_gpu_at_the_same_clocks_is_found() {
        let a = results(1.0, Some(1980));
        let b = results(1.08, Some(1980));
        let rep = spread(&[
            DeviceRun {
                device: 0,
                name: "H200",
                kernels: &a,
            },
            DeviceRun {
                device: 1,
                name: "H200",
                kernels: &b,
            },
        ]);
        assert_eq!(rep.findings.len(), 1);
        let f = &rep.findings[0];
        assert_eq!(
            (f.id.as_str(), f.device),
            ("multigpu/slower-at-same-clocks", 1)
        );
        assert!(
            f.message.contains("8.0% longer") && f.message.contains("1980 MHz"),
            "{}",
            f.message
        );
    }

    #[test]
    fn lower_clocks_and_throttling_are_named() {
        let a = results(1.0, Some(1980));
        let b = results(1.10, Some(1785));
        let mut c = results(1.0, Some(1980));
        c.cases[0].throttle = vec!["sw_power_cap".into()];
        let rep = spread(&[
            DeviceRun {
                device: 0,
                name: "H200",
                kernels: &a,
            },
            DeviceRun {
                device: 1,
                name: "H200",
                kernels: &b,
            },
            DeviceRun {
                device: 2,
                name: "H200",
                kernels: &c,
            },
        ]);
        let ids: Vec<(&str, usize)> = rep
            .findings
            .iter()
            .map(|f| (f.id.as_str(), f.device))
            .collect();
        assert_eq!(
            ids,
            vec![("multigpu/lower-clocks", 1), ("multigpu/lower-clocks", 2)]
        );
        assert!(rep.findings[0]
            .message
            .contains("1785 MHz against 1980 MHz on GPU0"));
        assert!(rep.findings[1].message.contains("sw_power_cap"));
    }

    #[test]
    fn different_models_and_missing_cases_are_not_compared() {
        let a = results(1.0, Some(1980));
        let mut b = results(2.0, Some(1500));
        b.cases.pop();
        let c = results(1.0, None);
        let rep = spread(&[
            DeviceRun {
                device: 0,
                name: "H200",
                kernels: &a,
            },
            DeviceRun {
                device: 1,
                name: "RTX 5090",
                kernels: &b,
            },
            DeviceRun {
                device: 2,
                name: "H200",
                kernels: &c,
            },
        ]);
        assert!(rep.findings.is_empty(), "{:?}", rep.findings);
        assert_eq!(rep.rows.len(), 3, "only the H200 pair is compared");
        assert!(rep.rows.iter().all(|r| r.medians.iter().all(|m| m.0 != 1)));
        assert_eq!(rep.devices.len(), 3);
        assert_eq!(rep.devices[1].cases, 0);
        // A lone GPU is described, not compared.
        let one = spread(&[DeviceRun {
            device: 0,
            name: "H200",
            kernels: &a,
        }]);
        assert!(one.rows.is_empty() && one.findings.is_empty());
        assert_eq!(one.devices[0].median_sm_clock_mhz, Some(1980));
    }
}
