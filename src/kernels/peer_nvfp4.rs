//! What the NVFP4 W4A16 peers (`humming`, `vllm-marlin`, `vllm`; scripts/peer_kernels.py) need to
//! run on exactly rigbench's operands and be checked against rigbench's CPU reference: the
//! `nvfp4` section of the peer spec.
//!
//! - `generator`: how rigbench's NVFP4 weights are made ([`super::data::nvfp4_weight`]: the
//!   lowbias32 hash, the W4A16 weight seed, the code and scale salts, `weight_scale_2`). The script
//!   regenerates the ModelOpt tensors (`weight` u8 `[N, K/2]`, `weight_scale` E4M3 `[N, K/16]`,
//!   `weight_scale_2` FP32) on the GPU bit for bit.
//! - per shape, `probe`: the code and scale bytes at a few positions (first, last and hashed ones),
//!   which the script compares exactly before using its tensors.
//! - per shape and M, `cases`: the activation seed rigbench's own cases use
//!   ([`super::bench::case_seeds`]), the sampled rows and columns of its check, and the f64
//!   reference there (`Σ_k w[n][k] · a[m][k]` over the exactly dequantized weights and the BF16
//!   activations, [`super::reference::sampled_gemm`]), row-major.
//! - `tolerance`: the W4A16 tolerance rigbench's own kernel is held to.

use serde_json::{json, Value};

use super::data::{
    bf16_uniform, hash32, nvfp4_code_byte, nvfp4_row_f64, nvfp4_scale_byte, NVFP4_CODE_SALT,
    NVFP4_GLOBAL_SCALE, NVFP4_SCALE_SALT,
};
use super::reference::{sample_axes, sampled_gemm};
use super::suite::Suite;
use crate::formats::nvfp4::NVFP4_BLOCK;
use crate::gemm::check::W4A16_GEMM_REL_L2;

/// Positions probed per tensor (besides the first and the last).
pub const PROBES: usize = 14;

/// Byte positions to probe in a tensor of `len` bytes: 0, `len − 1`, and [`PROBES`] hashed ones.
pub fn probe_positions(len: usize, salt: u32) -> Vec<usize> {
    let mut v = vec![0, len.saturating_sub(1)];
    for i in 0..PROBES as u32 {
        v.push(hash32(i ^ hash32(salt)) as usize % len.max(1));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The probe of one `[n, k]` weight: `{"codes": [[i, byte]...], "scales": [[i, byte]...]}`.
pub fn probe(n: usize, k: usize, seed: u32) -> Value {
    let codes: Vec<[u64; 2]> = probe_positions(n * k / 2, 1)
        .into_iter()
        .map(|i| [i as u64, nvfp4_code_byte(i as u32, seed) as u64])
        .collect();
    let scales: Vec<[u64; 2]> = probe_positions(n * k / NVFP4_BLOCK, 2)
        .into_iter()
        .map(|i| [i as u64, nvfp4_scale_byte(i as u32, seed) as u64])
        .collect();
    json!({"codes": codes, "scales": scales})
}

/// The reference of one (shape, M): seeds, sampled coordinates and values.
fn case(si: usize, mi: usize, m: usize, n: usize, k: usize, seed_w: u32) -> Value {
    let (seed_a, axes_seed) = super::bench::case_seeds(si, mi);
    let (rows, cols) = sample_axes(m, n, 32, 64, axes_seed);
    let a_row = |r: usize| -> Vec<f64> {
        (0..k)
            .map(|kk| bf16_uniform((r * k + kk) as u32, seed_a, 1.0) as f64)
            .collect()
    };
    let w_row = |c: usize| nvfp4_row_f64(c, k, seed_w);
    let values = sampled_gemm(&rows, &cols, k, &a_row, &w_row);
    json!({"m": m, "seed_a": seed_a, "rows": rows, "cols": cols, "values": values})
}

/// The `nvfp4` section of the peer spec for `suite` (its shapes and M values, in suite order, as
/// the kernel bench ran them), with the references computed on up to `threads` threads. Shapes
/// whose K is not a multiple of 16 (no NVFP4 form) are left out.
pub fn spec_section(suite: &Suite, seed_w: u32, threads: usize) -> Value {
    let mut jobs: Vec<(usize, usize)> = Vec::new();
    for (si, s) in suite.shapes.iter().enumerate() {
        if s.k % NVFP4_BLOCK != 0 || s.n == 0 {
            continue;
        }
        for mi in 0..suite.m.len() {
            jobs.push((si, mi));
        }
    }
    let threads = threads.clamp(1, jobs.len().max(1));
    let per = jobs.len().div_ceil(threads).max(1);
    let results: Vec<Vec<((usize, usize), Value)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = jobs
            .chunks(per)
            .map(|chunk| {
                sc.spawn(move || {
                    chunk
                        .iter()
                        .map(|&(si, mi)| {
                            let s = &suite.shapes[si];
                            ((si, mi), case(si, mi, suite.m[mi], s.n, s.k, seed_w))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut shapes = serde_json::Map::new();
    for (si, s) in suite.shapes.iter().enumerate() {
        if s.k % NVFP4_BLOCK != 0 || s.n == 0 {
            continue;
        }
        let cases: Vec<Value> = results
            .iter()
            .flatten()
            .filter(|((i, _), _)| *i == si)
            .map(|(_, v)| v.clone())
            .collect();
        shapes.insert(
            s.name.clone(),
            json!({"n": s.n, "k": s.k, "probe": probe(s.n, s.k, seed_w), "cases": cases}),
        );
    }
    json!({
        "generator": {
            "hash": "lowbias32",
            "seed": seed_w,
            "code_salt": NVFP4_CODE_SALT,
            "scale_salt": NVFP4_SCALE_SALT,
            "weight_scale_2": NVFP4_GLOBAL_SCALE,
        },
        "tolerance": {"name": "W4A16_GEMM_REL_L2", "value": W4A16_GEMM_REL_L2},
        "shapes": shapes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_holds_rigbench_seeds_references_and_probes() {
        let mut suite = crate::kernels::suite::load("smoke").unwrap();
        suite.m = vec![1, 3];
        let seed = crate::kernels::impls::w4a16::SEED_W;
        let v = spec_section(&suite, seed, 2);
        assert_eq!(v["generator"]["seed"], seed);
        assert_eq!(v["generator"]["code_salt"], 0x5eed_0001);
        let ba = &v["shapes"]["in_proj_ba"];
        assert_eq!(ba["n"], 96);
        let cases = ba["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 2);
        // in_proj_ba is the second shape of the smoke suite; M = 3 its second M.
        let c = &cases[1];
        assert_eq!(c["m"], 3);
        assert_eq!(c["seed_a"], crate::kernels::bench::case_seeds(1, 1).0);
        assert_eq!(c["rows"].as_array().unwrap().len(), 3);
        assert_eq!(c["cols"].as_array().unwrap().len(), 64);
        // One value checked by hand: row 2, first sampled column, against the built weight.
        let w = crate::kernels::data::nvfp4_weight(96, 5120, seed, 2);
        let col = c["cols"][0].as_u64().unwrap() as usize;
        let seed_a = c["seed_a"].as_u64().unwrap() as u32;
        let want: f64 = (0..5120)
            .map(|kk| {
                bf16_uniform((2 * 5120 + kk) as u32, seed_a, 1.0) as f64 * w.value_f64(col, kk)
            })
            .sum();
        let got = c["values"][2 * 64].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{got} vs {want}"
        );
        // The probe's bytes are the weight's.
        for pair in ba["probe"]["codes"].as_array().unwrap() {
            let (i, b) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_u64().unwrap(),
            );
            assert_eq!(w.packed[i] as u64, b);
        }
        let sc = ba["probe"]["scales"].as_array().unwrap();
        assert!(sc.len() >= 10);
        let last = sc.last().unwrap();
        assert_eq!(last[0].as_u64().unwrap() as usize, 96 * 5120 / 16 - 1);
        assert_eq!(
            w.block_scales[96 * 5120 / 16 - 1] as u64,
            last[1].as_u64().unwrap()
        );
    }
}
