//! The kernel bench's mixture-of-experts cases (a suite's `[moe]` table): the GEMM layer's
//! grouped expert GEMM ([`crate::gemm::moe::launch_grouped`], the kernel the runtime runs) at the
//! token counts a decode step routes: batch B × top-k choices spread over E experts as a
//! [`RoutingDistribution`] says (balanced, Zipf-skewed, all-to-few), per weight format.
//!
//! Each case is timed two ways:
//! - **cold**: one launch after an L2 flush (nvbench's cold mode), the routing of seed 0;
//! - **graph**: `V` launches in one CUDA graph, each with its own routing (the same distribution
//!   drawn again and its experts rotated by `v · touched`), so that across the graph the touched
//!   experts' bytes exceed [`GRAPH_L2_FACTOR`] × L2 (or every expert is touched): consecutive
//!   decode steps route differently, and a graph of one routing would time L2, not HBM.
//!
//! The **byte floor** of one launch counts each touched expert's weights once (the union over
//! the batch, in the format's device layout), the activations read and the output written
//! ([`floor_bytes`]); its time at the copy bandwidth of the same run is what the kernel is held
//! to (the target: within 1.5× at decode token counts).
//!
//! Weights are generated on the host per expert from a seed (so any expert is regenerated for
//! the check without keeping a copy): BF16 uniform values, FP8 E4M3 codes with per-row scales,
//! NVFP4 random E2M1 codes with E4M3 block scales; each expert's scales differ, so a wrong
//! expert is caught. The check compares sampled routed pairs with a CPU reference
//! ([`reference_row`]).

use super::device::{time_graph_launches, time_launches, GpuTiming, GRAPH_L2_FACTOR};
use super::schema::{GraphSetup, Timing};
pub use super::schema::{GroupedCase, GroupedResults, MoeStepRow};
pub use super::suite::{parse_distribution, GroupedLinear, MoeSpec};
use crate::formats::{e4m3, nvfp4::Nvfp4Weight, w4a16_pack, GemmFormat};
use crate::gemm::moe::{self as gm, ExpertTables, GroupedInput, Routing, RoutingDistribution};
use crate::gpu::{DevBuf, FlushMethod, Gpu, L2Flusher, Module};
use crate::stats::rng::SplitMix64;
use crate::stats::StoppingRule;

/// Device bytes of one expert's `[n, k]` weight in `format` (BF16 2 bytes, FP8 1 byte plus an
/// FP32 scale per row, W4A16 the kernel layout: N to 16, K to 128, half a byte per value and a
/// scale byte per 16).
pub fn expert_bytes(format: GemmFormat, n: usize, k: usize) -> u64 {
    let (n, k) = (n as u64, k as u64);
    match format {
        GemmFormat::Bf16 => 2 * n * k,
        GemmFormat::Fp8 => n * k + 4 * n,
        _ => {
            let (np, kp) = (n.div_ceil(16) * 16, k.div_ceil(128) * 128);
            np * kp / 2 + np * kp / 16
        }
    }
}

/// The byte floor of one grouped launch: `touched` experts' weights once, `x_rows` input rows of
/// K (BF16, or E4M3 with an FP32 scale), `pairs` output rows of N in BF16.
pub fn floor_bytes(
    format: GemmFormat,
    (n, k): (usize, usize),
    touched: usize,
    x_rows: usize,
    pairs: usize,
) -> u64 {
    let x = match format {
        GemmFormat::Fp8 => (x_rows * (k + 4)) as u64,
        _ => (x_rows * k * 2) as u64,
    };
    touched as u64 * expert_bytes(format, n, k) + x + (pairs * n * 2) as u64
}

/// Expert `e`'s weight, generated from `seed`: BF16 bits, FP8 codes with row scales, or NVFP4.
enum HostExpert {
    Bf16(Vec<u16>),
    Fp8(Vec<u8>, Vec<f32>),
    W4(Nvfp4Weight),
}

/// Generate expert `e` of `experts` (`[n, k]`) in `format` from `seed`.
fn host_expert(
    format: GemmFormat,
    n: usize,
    k: usize,
    e: usize,
    experts: usize,
    seed: u64,
) -> HostExpert {
    let mut r = SplitMix64::new(seed ^ (e as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Each expert its own scale, so that a wrong expert's output differs.
    let tilt = 1.0 + e as f32 / experts.max(1) as f32;
    match format {
        GemmFormat::Bf16 => {
            let a = tilt / (k as f32).sqrt();
            let v = (0..n * k)
                .map(|_| {
                    let u = (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    half::bf16::from_f32(u * a).to_bits()
                })
                .collect();
            HostExpert::Bf16(v)
        }
        GemmFormat::Fp8 => {
            let codes = (0..n * k)
                .map(|_| {
                    // Exponent field 1..=8 (|x| in [2^-6, 2^2)), any sign and mantissa: no NaN.
                    let b = r.next_u64();
                    let exp = 1 + (b % 8) as u8;
                    ((b >> 8) as u8 & 0x80) | (exp << 3) | ((b >> 16) as u8 & 0x07)
                })
                .collect();
            let scales = (0..n)
                .map(|_| tilt * (0.5 + (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32) / 64.0)
                .collect();
            HostExpert::Fp8(codes, scales)
        }
        _ => {
            let packed = (0..n * k / 2).map(|_| r.next_u64() as u8).collect();
            // E4M3 block scales in [0.25, 4): exponent fields 5..=8.
            let bs = (0..n * k / 16)
                .map(|_| {
                    let b = r.next_u64();
                    ((5 + (b % 4) as u8) << 3) | ((b >> 8) as u8 & 0x07)
                })
                .collect();
            HostExpert::W4(Nvfp4Weight {
                n,
                k,
                packed,
                block_scales: bs,
                global_scale: 0.01 * tilt,
            })
        }
    }
}

/// CPU reference of one output row set: `y[row] = Σ_k x[kk] · W[row, kk]` (× scales) for every
/// row of an expert, `x` given as f32 values (BF16, or E4M3 decoded times its row scale).
pub fn reference_row(w: &dyn Fn(usize, usize) -> f64, x: &[f64], n: usize) -> Vec<f64> {
    (0..n)
        .map(|row| x.iter().enumerate().map(|(kk, xv)| xv * w(row, kk)).sum())
        .collect()
}

/// A device expert set: per-expert buffers and the address tables.
struct DeviceExperts {
    _bufs: Vec<DevBuf>,
    _tables: Vec<DevBuf>,
    tables: ExpertTables,
}

fn upload_experts(
    gpu: &Gpu,
    format: GemmFormat,
    (n, k): (usize, usize),
    experts: usize,
    seed: u64,
) -> anyhow::Result<DeviceExperts> {
    let mut bufs = Vec::new();
    let (mut wp, mut sp, mut os) = (Vec::new(), Vec::new(), Vec::new());
    let mut layout = (0, 0);
    for e in 0..experts {
        match host_expert(format, n, k, e, experts, seed) {
            HostExpert::Bf16(v) => {
                let b = gpu.upload(&v)?;
                wp.push(b.ptr());
                bufs.push(b);
            }
            HostExpert::Fp8(c, s) => {
                let (b, sb) = (gpu.upload(&c)?, gpu.upload(&s)?);
                wp.push(b.ptr());
                sp.push(sb.ptr());
                bufs.extend([b, sb]);
            }
            HostExpert::W4(w) => {
                let p = w4a16_pack::repack(&w)?;
                let (b, sb) = (gpu.upload(&p.weights)?, gpu.upload(&p.scales)?);
                wp.push(b.ptr());
                sp.push(sb.ptr());
                os.push(p.out_scale);
                layout = (p.strips(), p.k_tiles());
                bufs.extend([b, sb]);
            }
        }
    }
    let wt = gpu.upload(&wp)?;
    let mut tables_keep = Vec::new();
    let tables = match format {
        GemmFormat::Bf16 => ExpertTables::Bf16 { w: wt.ptr() },
        GemmFormat::Fp8 => {
            let st = gpu.upload(&sp)?;
            let t = ExpertTables::Fp8 {
                w: wt.ptr(),
                s: st.ptr(),
            };
            tables_keep.push(st);
            t
        }
        _ => {
            let (st, ot) = (gpu.upload(&sp)?, gpu.upload(&os)?);
            let t = ExpertTables::W4 {
                wq: wt.ptr(),
                sc: st.ptr(),
                out_scales: ot.ptr(),
                strips: layout.0,
                kt_n: layout.1,
            };
            tables_keep.extend([st, ot]);
            t
        }
    };
    tables_keep.push(wt);
    Ok(DeviceExperts {
        _bufs: bufs,
        _tables: tables_keep,
        tables,
    })
}

/// One routing on the device.
struct DeviceRouting {
    ids: Vec<i32>,
    touched: usize,
    _bufs: [DevBuf; 4],
    r: Routing,
}

fn upload_routing(gpu: &Gpu, ids: Vec<i32>, experts: usize) -> anyhow::Result<DeviceRouting> {
    let g = gm::group_by_expert(&ids, experts);
    let sorted = gpu.upload(&g.sorted)?;
    let active = gpu.upload(&g.active)?;
    let offsets = gpu.upload(&g.offsets)?;
    let n_active = gpu.upload(&[g.active.len() as i32])?;
    let r = Routing {
        ids: 0,
        weights: 0,
        sorted: sorted.ptr(),
        active: active.ptr(),
        offsets: offsets.ptr(),
        n_active: n_active.ptr(),
    };
    Ok(DeviceRouting {
        ids,
        touched: g.active.len(),
        _bufs: [sorted, active, offsets, n_active],
        r,
    })
}

/// Routing `v` of a case: `dist` drawn with seed `v`, its experts rotated by `v · shift`.
fn variant_ids(
    dist: RoutingDistribution,
    batch: usize,
    k: usize,
    e: usize,
    v: usize,
    shift: usize,
) -> Vec<i32> {
    gm::route_ids(dist, batch, k, e, v as u64)
        .into_iter()
        .map(|x| ((x as usize + v * shift) % e) as i32)
        .collect()
}

/// The modules a grouped case runs on: `kernels/gemv.cu` (BF16, FP8), `kernels/moe.cu` (any
/// K), the default flavour of `kernels/w4a16.cu` (W4A16), and `kernels/util.cu` for the L2
/// flush.
pub struct GroupedModules {
    gemv: Option<Module>,
    w4: Option<Module>,
    moe: Module,
    util: Module,
}

impl GroupedModules {
    /// Build them on `gpu`; a module that fails is left out with its reason in `notes`.
    ///
    /// # Errors
    /// `kernels/util.cu` or `kernels/moe.cu` fails to build.
    pub fn build(gpu: &Gpu, notes: &mut Vec<String>) -> anyhow::Result<Self> {
        let util = gpu.compile(
            "util",
            crate::gpu::util_kernels::SRC,
            crate::gpu::util_kernels::KERNELS,
        )?;
        let names = crate::gemm::gemv::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let gemv = gpu
            .compile_with("gemv", crate::gemm::gemv::SRC, &refs, &[])
            .map_err(|e| notes.push(format!("kernels/gemv.cu did not build: {e}")))
            .ok();
        let names = crate::gemm::w4a16::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let defines: Vec<String> = crate::gemm::W4A16_DEFAULT_FLAVOR
            .1
            .iter()
            .map(|d| d.to_string())
            .collect();
        let w4 = gpu
            .compile_with("w4a16", crate::gemm::w4a16::SRC, &refs, &defines)
            .map_err(|e| notes.push(format!("kernels/w4a16.cu did not build: {e}")))
            .ok();
        let names = gm::kernel_names();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let moe = gpu.compile("moe", gm::SRC, &refs)?;
        Ok(Self {
            gemv,
            w4,
            moe,
            util,
        })
    }
}

/// Run every case of `spec` in `formats` (BF16, FP8, W4A16; others are noted and skipped) on
/// `gpu` (its stream must allow capture: [`Gpu::open_device_stream`] with its own stream),
/// timing under `rule`; `copy_bytes_per_s` is the run's copy bandwidth, `l2_bytes` the card's L2.
///
/// # Errors
/// A failure outside one case (modules, the flusher); a case's own failure is its note.
pub fn run(
    gpu: &Gpu,
    spec: &MoeSpec,
    formats: &[GemmFormat],
    rule: &StoppingRule,
    copy_bytes_per_s: f64,
    l2_bytes: u64,
) -> anyhow::Result<GroupedResults> {
    let mut res = GroupedResults {
        copy_bytes_per_s,
        spec: Some(spec.clone()),
        ..Default::default()
    };
    spec.check().map_err(anyhow::Error::msg)?;
    let mods = GroupedModules::build(gpu, &mut res.notes)?;
    let flusher = L2Flusher::new(gpu, FlushMethod::Read)?;
    let cold_dev = GpuTiming::new(gpu, Some((&flusher, &mods.util)))?;
    let graph_dev = GpuTiming::new(gpu, None)?;
    let (e, k) = (spec.experts, spec.top_k);
    for &format in formats {
        if !matches!(
            format,
            GemmFormat::Bf16 | GemmFormat::Fp8 | GemmFormat::W4a16
        ) {
            res.notes.push(format!(
                "{}: the grouped expert GEMM runs BF16, FP8 and W4A16 only",
                format.id()
            ));
            continue;
        }
        for (li, lin) in spec.linears.iter().enumerate() {
            let seed = 0x5EED_0000 + li as u64;
            let experts = match upload_experts(gpu, format, (lin.n, lin.k), e, seed) {
                Ok(x) => x,
                Err(err) => {
                    res.notes.push(format!(
                        "{} {}: the experts could not be uploaded: {err:#}",
                        format.id(),
                        lin.name
                    ));
                    continue;
                }
            };
            for &batch in &spec.batches {
                for dname in &spec.distributions {
                    let dist = parse_distribution(dname, k).map_err(anyhow::Error::msg)?;
                    let case = run_case(
                        gpu,
                        &mods,
                        (&cold_dev, &graph_dev),
                        rule,
                        format,
                        lin,
                        &experts,
                        (e, k, batch, dist, dname, seed),
                        l2_bytes,
                    );
                    match case {
                        Ok(c) => res.cases.push(c),
                        Err(err) => res.notes.push(format!(
                            "{} {} B={batch} {dname}: {err:#}",
                            format.id(),
                            lin.name
                        )),
                    }
                    if crate::signals::interrupted().is_some() {
                        return Ok(res);
                    }
                }
            }
        }
    }
    Ok(res)
}

/// The largest relative L2 error of a case's sampled outputs against the CPU reference, in
/// every format (the reference takes the same quantized weights and activations, so what is
/// left is the BF16 rounding of the output, 2⁻⁹ relative, with room for FP32 summation order,
/// as the dense GEMV's check allows).
pub const TOLERANCE: f64 = 1e-2;

/// Most routings one graph rotates over.
const MAX_VARIANTS: usize = 64;

/// Sampled pairs checked against the CPU reference per case.
const CHECK_PAIRS: usize = 8;

#[allow(clippy::too_many_arguments)]
fn run_case(
    gpu: &Gpu,
    mods: &GroupedModules,
    (cold_dev, graph_dev): (&GpuTiming, &GpuTiming),
    rule: &StoppingRule,
    format: GemmFormat,
    lin: &GroupedLinear,
    experts: &DeviceExperts,
    (e, k, batch, dist, dname, seed): (usize, usize, usize, RoutingDistribution, &str, u64),
    l2_bytes: u64,
) -> anyhow::Result<GroupedCase> {
    let pairs = batch * k;
    let x_rows = if lin.per_token { batch } else { pairs };
    let x_div = if lin.per_token { k } else { 1 };
    // Activations: BF16 rows, or E4M3 rows with FP32 row scales.
    let mut r = SplitMix64::new(seed ^ 0xAC7 ^ batch as u64);
    let unit = |r: &mut SplitMix64| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    let (x_vals, x_buf, s_buf): (Vec<f64>, DevBuf, Option<DevBuf>) = if format == GemmFormat::Fp8 {
        let codes: Vec<u8> = (0..x_rows * lin.k)
            .map(|_| e4m3::encode(unit(&mut r) * 4.0))
            .collect();
        let sc: Vec<f32> = (0..x_rows)
            .map(|i| 0.01 * (1.0 + i as f32 / 64.0))
            .collect();
        let vals = codes
            .iter()
            .enumerate()
            .map(|(i, c)| e4m3::decode(*c) as f64 * sc[i / lin.k] as f64)
            .collect();
        (vals, gpu.upload(&codes)?, Some(gpu.upload(&sc)?))
    } else {
        let bits: Vec<u16> = (0..x_rows * lin.k)
            .map(|_| half::bf16::from_f32(unit(&mut r)).to_bits())
            .collect();
        let vals = bits
            .iter()
            .map(|b| half::bf16::from_bits(*b).to_f64())
            .collect();
        (vals, gpu.upload(&bits)?, None)
    };
    let input = GroupedInput {
        x: x_buf.ptr(),
        scales: s_buf.as_ref().map_or(0, |b| b.ptr()),
        x_div,
        tokens: batch,
    };
    let y = gpu.alloc(pairs * lin.n * 2)?;
    let cols = gm::max_active(e, k, batch);
    let launch = |rt: &Routing| {
        gm::launch_grouped(
            gpu,
            (mods.gemv.as_ref(), Some(&mods.moe), mods.w4.as_ref()),
            &experts.tables,
            &input,
            rt,
            y.ptr(),
            (lin.n, lin.k),
            cols,
        )
    };
    // Cold, routing 0; then its output against the reference.
    let r0 = upload_routing(gpu, variant_ids(dist, batch, k, e, 0, 0), e)?;
    let floor0 = floor_bytes(format, (lin.n, lin.k), r0.touched, x_rows, pairs);
    let cold = time_launches(cold_dev, 2, true, rule, &|| launch(&r0.r))?;
    let rel_l2 = check(gpu, format, lin, &r0.ids, &x_vals, &y, (e, k, seed))?;
    // Graph: enough routings that their touched experts exceed GRAPH_L2_FACTOR × L2.
    let per_expert = expert_bytes(format, lin.n, lin.k);
    let want = GRAPH_L2_FACTOR * l2_bytes;
    let variants =
        ((want / (r0.touched as u64 * per_expert).max(1)) as usize + 1).clamp(2, MAX_VARIANTS);
    let routings = (0..variants)
        .map(|v| upload_routing(gpu, variant_ids(dist, batch, k, e, v, r0.touched), e))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let graph_floor = routings
        .iter()
        .map(|x| floor_bytes(format, (lin.n, lin.k), x.touched, x_rows, pairs) as f64)
        .sum::<f64>()
        / variants as f64;
    gpu.sync()?;
    gpu.begin_capture()?;
    let captured = routings.iter().try_for_each(|x| launch(&x.r));
    let graph = gpu.end_capture();
    captured?;
    let graph = graph?;
    let setup = GraphSetup {
        launches: variants,
        weight_copies: 1,
        weight_bytes_total: routings.iter().map(|x| x.touched as u64 * per_expert).sum(),
    };
    let graph_t = time_graph_launches(graph_dev, 2, rule, &|| Ok(graph.launch()?), setup)?;
    Ok(GroupedCase {
        linear: lin.name.clone(),
        format: format.id().into(),
        n: lin.n,
        k: lin.k,
        experts: e,
        top_k: k,
        batch,
        distribution: dname.into(),
        pairs,
        touched: r0.touched,
        floor_bytes: floor0,
        cold: Some(cold),
        graph: Some(graph_t),
        graph_floor_bytes: graph_floor,
        rel_l2: Some(rel_l2),
        note: None,
    })
}

/// The sampled pairs' output rows against the CPU reference: their relative L2 error.
fn check(
    gpu: &Gpu,
    format: GemmFormat,
    lin: &GroupedLinear,
    ids: &[i32],
    x: &[f64],
    y: &DevBuf,
    (e, k, seed): (usize, usize, u64),
) -> anyhow::Result<f64> {
    let pairs = ids.len();
    let got: Vec<u16> = gpu.download(y, 0, pairs * lin.n)?;
    let step = (pairs / CHECK_PAIRS).max(1);
    let (mut num, mut den) = (0f64, 0f64);
    for p in (0..pairs).step_by(step).take(CHECK_PAIRS) {
        let ex = ids[p] as usize;
        let row = if lin.per_token { p / k } else { p };
        let xr = &x[row * lin.k..(row + 1) * lin.k];
        let want = match host_expert(format, lin.n, lin.k, ex, e, seed) {
            HostExpert::Bf16(w) => reference_row(
                &|r, c| half::bf16::from_bits(w[r * lin.k + c]).to_f64(),
                xr,
                lin.n,
            ),
            HostExpert::Fp8(w, s) => reference_row(
                &|r, c| e4m3::decode(w[r * lin.k + c]) as f64 * s[r] as f64,
                xr,
                lin.n,
            ),
            HostExpert::W4(w) => reference_row(&|r, c| w.value_f64(r, c), xr, lin.n),
        };
        for (i, wv) in want.iter().enumerate() {
            let g = half::bf16::from_bits(got[p * lin.n + i]).to_f64();
            num += (g - wv).powi(2);
            den += wv * wv;
        }
    }
    Ok((num / den.max(f64::MIN_POSITIVE)).sqrt())
}

/// The MoE decode-step composite of `k` ([`MoeStepRow`]): rows where every dense shape of the
/// step has a graph-timed case at M = B in the format, and every grouped linear a graph timing.
pub fn step_rows(k: &super::schema::KernelResults, spec: &MoeSpec) -> Vec<MoeStepRow> {
    let Some(g) = &k.moe_grouped else {
        return Vec::new();
    };
    let Some(step) = &k.suite.decode_step else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for fmt in ["bf16", "fp8", "w4a16"] {
        for &b in &spec.batches {
            let mut dense = 0.0;
            let mut complete = true;
            for s in &step.shapes {
                if spec.linears.iter().any(|l| l.name == s.shape) {
                    continue;
                }
                let t = k
                    .cases
                    .iter()
                    .find(|c| c.implementation == fmt && c.shape == s.shape && c.m == b)
                    .and_then(|c| c.graph_total_s());
                match t {
                    Some(t) => dense += t * s.count as f64,
                    None => complete = false,
                }
            }
            if !complete {
                continue;
            }
            for d in &spec.distributions {
                let cases: Vec<&GroupedCase> = g
                    .cases
                    .iter()
                    .filter(|c| c.format == fmt && c.batch == b && &c.distribution == d)
                    .collect();
                if cases.len() != spec.linears.len() || cases.iter().any(|c| c.graph.is_none()) {
                    continue;
                }
                let n = spec.sparse_layers as f64;
                rows.push(MoeStepRow {
                    format: fmt.into(),
                    batch: b,
                    distribution: d.clone(),
                    dense_s: dense,
                    experts_s: n * cases
                        .iter()
                        .map(|c| c.graph.as_ref().map_or(0.0, |t| t.median_s))
                        .sum::<f64>(),
                    experts_floor_bytes: n * cases.iter().map(|c| c.graph_floor_bytes).sum::<f64>(),
                });
            }
        }
    }
    rows
}

/// The composite rows as Markdown (empty without rows).
pub fn step_markdown(rows: &[MoeStepRow], copy_bytes_per_s: f64) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "\n#### Decode step with the grouped experts\n\nThe linear layers of one decode step at batch B: the dense shapes of the suite's step at M = B plus every sparse layer's grouped expert GEMMs at B tokens routed as named, all in graph timing. tok/s = B ÷ step time (linear layers only: attention, norms, routing and sampling would lower it). The shared expert counts here as its dense shapes (the suite's step), as an engine without shared-expert fusion runs it; the runtime fuses it into the grouped GEMMs where it has the routed experts' format and shape (docs/runtime.md, \"Mixtures of experts\").\n\n",
    );
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.format.clone(),
                r.batch.to_string(),
                r.distribution.clone(),
                format!("{:.3}", r.dense_s * 1e3),
                format!("{:.3}", r.experts_s * 1e3),
                format!(
                    "{:.2}×",
                    r.experts_s / (r.experts_floor_bytes / copy_bytes_per_s.max(1.0)).max(1e-12)
                ),
                format!("{:.0}", r.tok_per_s()),
            ]
        })
        .collect();
    o.push_str(&crate::output::table::markdown_table(
        &[
            "format",
            "batch",
            "routing",
            "dense ms",
            "experts ms",
            "experts / floor",
            "tok/s bound (linears)",
        ],
        &table,
    ));
    o
}

/// The cases as a Markdown table, with how to read it.
pub fn markdown(r: &GroupedResults) -> String {
    let mut o = String::new();
    if r.cases.is_empty() && r.notes.is_empty() {
        return o;
    }
    o.push_str("\n### Mixture-of-experts grouped GEMMs\n\n");
    o.push_str(&format!(
        "The grouped expert GEMM the runtime runs (one launch per layer and linear; `src/gemm/moe.rs`) at the tokens a decode step routes. Floor = the touched experts' weights once + activations + output, at this run's copy bandwidth ({:.2} TB/s). Cold: one launch after an L2 flush; graph: launches in one CUDA graph, each its own routing (experts rotated), per launch.\n\n",
        r.copy_bytes_per_s / 1e12
    ));
    let rows: Vec<Vec<String>> = r
        .cases
        .iter()
        .map(|c| {
            let (oc, og) = c.over_floor(r.copy_bytes_per_s);
            let us = |t: &Option<Timing>| {
                t.as_ref()
                    .map_or("—".into(), |t| format!("{:.1}", t.median_s * 1e6))
            };
            let x = |v: Option<f64>| v.map_or("—".into(), |v| format!("{v:.2}×"));
            vec![
                c.linear.clone(),
                c.format.clone(),
                c.batch.to_string(),
                c.distribution.clone(),
                format!("{} / {}", c.touched, c.experts),
                crate::output::table::human_bytes(c.floor_bytes),
                us(&c.cold),
                x(oc),
                us(&c.graph),
                x(og),
                c.rel_l2.map_or("—".into(), |v| format!("{v:.1e}")),
            ]
        })
        .collect();
    o.push_str(&crate::output::table::markdown_table(
        &[
            "linear",
            "format",
            "batch",
            "routing",
            "experts touched",
            "floor bytes",
            "cold µs",
            "cold / floor",
            "graph µs",
            "graph / floor",
            "rel. L2",
        ],
        &rows,
    ));
    for n in &r.notes {
        o.push_str(&format!("\n- {n}"));
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MoeSpec {
        MoeSpec {
            experts: 256,
            top_k: 8,
            batches: vec![1, 32],
            distributions: vec!["balanced".into(), "zipf:1.2".into(), "few:16".into()],
            linears: vec![GroupedLinear {
                name: "expert_gate_up".into(),
                n: 1024,
                k: 2048,
                per_token: true,
            }],
            sparse_layers: 40,
        }
    }

    #[test]
    fn the_spec_is_checked_key_by_key() {
        assert!(spec().check().is_ok());
        let mut s = spec();
        s.distributions.push("few:4".into());
        assert!(s.check().unwrap_err().contains("few:4"));
        let mut s = spec();
        s.linears[0].k = 1000;
        assert!(s.check().unwrap_err().contains("multiple of 128"));
        let mut s = spec();
        s.experts = 5000;
        assert!(s.check().unwrap_err().contains("experts"));
        let mut s = spec();
        s.batches = vec![];
        assert!(s.check().is_err());
        assert_eq!(
            parse_distribution("zipf:1.2", 8),
            Ok(RoutingDistribution::Zipf { s: 1.2 })
        );
        assert!(parse_distribution("zipf:-1", 8).is_err());
        assert!(parse_distribution("uniform", 8).is_err());
    }

    #[test]
    fn floors_count_each_touched_expert_once_in_its_layout() {
        // Qwen3.6-35B-A3B gate_up at batch 1: 8 experts of 1024 × 2048 BF16 = 32 MiB.
        let f = floor_bytes(GemmFormat::Bf16, (1024, 2048), 8, 1, 8);
        assert_eq!(f, 8 * 2 * 1024 * 2048 + 2 * 2048 + 8 * 1024 * 2);
        // W4A16: a quarter of the BF16 weight plus one scale byte per 16 values.
        assert_eq!(
            expert_bytes(GemmFormat::W4a16, 1024, 2048),
            1024 * 2048 / 2 + 1024 * 2048 / 16
        );
        assert_eq!(
            expert_bytes(GemmFormat::Fp8, 2048, 512),
            2048 * 512 + 4 * 2048
        );
    }

    #[test]
    fn routing_variants_rotate_to_other_experts() {
        let v0 = variant_ids(RoutingDistribution::Balanced, 1, 8, 256, 0, 8);
        let v1 = variant_ids(RoutingDistribution::Balanced, 1, 8, 256, 1, 8);
        assert_eq!(v0, (0..8).collect::<Vec<i32>>());
        assert_eq!(v1, (8..16).collect::<Vec<i32>>());
        // Every token keeps k distinct experts after the rotation.
        for v in 0..4 {
            let ids = variant_ids(RoutingDistribution::Zipf { s: 1.2 }, 4, 8, 256, v, 37);
            for t in ids.chunks(8) {
                let mut s = t.to_vec();
                s.sort_unstable();
                s.dedup();
                assert_eq!(s.len(), 8);
            }
        }
    }

    #[test]
    fn the_reference_and_the_generators_agree_with_the_formats() {
        // An FP8 expert has no NaN codes, and each expert's scales differ.
        let HostExpert::Fp8(c, s0) = host_expert(GemmFormat::Fp8, 16, 128, 0, 4, 1) else {
            panic!()
        };
        assert!(c.iter().all(|b| b & 0x7F != 0x7F));
        let HostExpert::Fp8(_, s3) = host_expert(GemmFormat::Fp8, 16, 128, 3, 4, 1) else {
            panic!()
        };
        assert!(s3.iter().sum::<f32>() > s0.iter().sum::<f32>());
        // NVFP4 experts repack, and their values are finite.
        let HostExpert::W4(w) = host_expert(GemmFormat::W4a16, 32, 256, 2, 4, 1) else {
            panic!()
        };
        assert!(w4a16_pack::repack(&w).is_ok());
        assert!((0..32).all(|r| (0..256).all(|c| w.value_f64(r, c).is_finite())));
        let y = reference_row(&|r, c| (r + c) as f64, &[1.0, 2.0], 2);
        assert_eq!(y, vec![2.0, 5.0]);
    }
}
