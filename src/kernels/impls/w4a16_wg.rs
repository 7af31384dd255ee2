//! Host side of rigbench's Hopper W4A16 kernel, `kernels/w4a16_wg.cu` (sm_90a only): the
//! swapped GEMM `Cᵀ[N, M] = W[N, K] · Aᵀ[K, M]` on `wgmma`, the dequantized NVFP4 weights as the
//! register A operand (64 rows per warpgroup) and the tokens as its N (8 … 256), the activations
//! written once per launch in the packed layout's K order by a pre-pass
//! ([`PERMUTE_KERNEL`]) and staged in shared memory by 16-byte copies with the 128-byte swizzle.
//! Read the kernel's header comment first; docs/w4a16-notes.md has the design and its figures.
//!
//! Here: the kernel instances, their shared-memory and workspace sizes, the launch
//! configurations offered to the tuner ([`candidates`]), the launch itself, the opt-in and the
//! probe that runs every configuration once in a child process before a bench or a runtime
//! uses the kernel ([`module_for`]), and [`emulate`]: a CPU mirror of one launch (loads, the
//! activation permutation and swizzle, the descriptor addressing, the wgmma fragment layouts,
//! the stripes and the ordered split-K reduction), checked against the reference GEMM in the
//! tests.

use crate::gpu::dim;
use std::sync::{Mutex, OnceLock};

use anyhow::Context;

use super::w4a16::{v2_owner, Config, W4a16View};
use crate::formats::w4a16_pack::{extract_reg, scale_bf16_bits, W4a16Packed};
use crate::gpu::{DevPtr, Gpu, Module};
use crate::kernels::W4Module;

/// Source of the kernel.
pub const WG_SRC: &str = include_str!("../../../kernels/w4a16_wg.cu");
/// Flavour name of its module among [`crate::kernels::Env::w4`].
pub const WG_FLAVOR: &str = "wgmma";
/// Architecture it is compiled for; only a card of compute capability 9.0 runs it.
pub const WG_ARCH: &str = "sm_90a";
/// Token tiles (wgmma N) instantiated.
pub const TN_VARIANTS: [usize; 6] = [8, 16, 32, 64, 128, 256];
/// Warpgroups per CTA instantiated (64 weight rows each).
pub const WG_VARIANTS: [usize; 2] = [1, 2];
/// Pipeline depths offered to the tuner (the kernel takes 2 ..= 8).
pub const STAGE_CHOICES: [usize; 3] = [3, 4, 6];
/// Largest split-K workspace a configuration may need; larger ones are not offered.
pub const WS_CAP_BYTES: usize = 256 << 20;
/// Environment variable: `off` keeps the kernel out of every tuner (default: offered on sm_90).
pub const ENV_ENABLE: &str = "RIGBENCH_W4A16_WG";
/// Environment variable: `off` trusts the kernel without the child-process probe.
pub const ENV_PROBE: &str = "RIGBENCH_W4A16_WG_PROBE";

/// The pre-pass kernel that writes the activations in the packed weights' K order (its output
/// is the first part of the launch's workspace, [`act_floats`]).
pub const PERMUTE_KERNEL: &str = "w4wg_permute_act";
/// Threads per CTA of [`PERMUTE_KERNEL`].
pub const PERMUTE_THREADS: usize = 256;

/// Smallest token tile with a `_p` instance (one commit group of wgmmas kept in flight).
pub const PIPE_MIN_TN: usize = 64;

/// Kernel name of an instance (`pipe`: the `_p` instance, TN ≥ [`PIPE_MIN_TN`]).
pub fn name(tn: usize, wg: usize, pipe: bool) -> String {
    format!("w4wg_t{tn}_g{wg}{}", if pipe { "_p" } else { "" })
}

/// The (TN, WG, pipe) instances of kernels/w4a16_wg.cu.
pub fn instances() -> Vec<(usize, usize, bool)> {
    let mut v = Vec::new();
    for tn in TN_VARIANTS {
        for wg in WG_VARIANTS {
            v.push((tn, wg, false));
            if tn >= PIPE_MIN_TN {
                v.push((tn, wg, true));
            }
        }
    }
    v
}

/// All kernel names in kernels/w4a16_wg.cu (the module loads these): the GEMM instances and
/// the [`PERMUTE_KERNEL`] pre-pass.
pub fn kernel_names() -> Vec<String> {
    instances()
        .into_iter()
        .map(|(tn, wg, pipe)| name(tn, wg, pipe))
        .chain(std::iter::once(PERMUTE_KERNEL.to_string()))
        .collect()
}

/// 16-row strips per group (one per warp: 4 per warpgroup).
pub fn group_strips(wg: usize) -> usize {
    4 * wg
}

/// Shared-memory bytes of one pipeline stage (a k-tile pair): two activation tiles of `tn`
/// rows × 128 bytes, the group's codes (1,024 bytes per strip) and scale words (128 bytes per
/// strip), rounded up to the 1,024-byte swizzle period (as `STAGE` in the kernel).
pub fn stage_bytes(tn: usize, wg: usize) -> usize {
    (2 * tn * 128 + group_strips(wg) * (1024 + 128)).div_ceil(1024) * 1024
}

/// Dynamic shared memory of a launch: the ring and 1,024 bytes to align it.
pub fn smem_bytes(tn: usize, wg: usize, stages: usize) -> usize {
    stages * stage_bytes(tn, wg) + 1024
}

/// The stripe `[begin, end)` of units CTA `c` owns (as the kernel computes it).
pub fn stripe(c: usize, units: usize, ctas: usize) -> (usize, usize) {
    (c * units / ctas, (c + 1) * units / ctas)
}

/// Whether any group's k range (`pairs` units) is split between CTAs.
pub fn any_split(units: usize, pairs: usize, ctas: usize) -> bool {
    (1..ctas).any(|c| stripe(c, units, ctas).0 % pairs != 0)
}

/// Split-K workspace floats of a launch: token tiles × CTAs × 2 slots of `64·wg × tn`, or 0 when
/// no group is split.
pub fn ws_floats(
    tn: usize,
    wg: usize,
    ctas: usize,
    tiles: usize,
    units: usize,
    pairs: usize,
) -> usize {
    if any_split(units, pairs, ctas) {
        tiles * ctas * 2 * group_strips(wg) * 16 * tn
    } else {
        0
    }
}

/// Workspace floats of the permuted activations: `tiles · tn` token rows of `64 · kt_n` BF16
/// values (`kt_n = 2 · pairs`), 2 per float. They precede the split-K slots.
pub fn act_floats(tn: usize, tiles: usize, pairs: usize) -> usize {
    tiles * tn * pairs * 64
}

/// Actual k offset (within its 64-wide k tile) of position `pos` of the permuted activations:
/// `pos = 16j + p` is MMA k position p of k16 step j, which the packed weights put at
/// `16·(p%8/2) + 4j + 2·(p/8) + p%2` (src/formats/w4a16_pack.rs; docs/w4a16-notes.md).
pub fn permuted_k_offset(pos: usize) -> usize {
    let (j, p) = (pos / 16, pos % 16);
    16 * (p % 8 / 2) + 4 * j + 2 * (p / 8) + p % 2
}

/// CPU mirror of [`PERMUTE_KERNEL`]: `act` `[m, k]` BF16 bits → `[m, kpad]` in the packed K
/// order (`kpad` = 64 · k tiles), zeros from `k` on. Computed per destination 16-byte chunk
/// with the kernel's own index math.
///
/// # Panics
/// `kpad` not a multiple of 64, or `act` shorter than `m · k`.
pub fn permute_act(act: &[u16], m: usize, k: usize, kpad: usize) -> Vec<u16> {
    assert!(kpad % 64 == 0 && act.len() >= m * k);
    let cpr = kpad / 8;
    let mut out = vec![0u16; m * kpad];
    for i in 0..m * cpr {
        let (mm, cc) = (i / cpr, i % cpr);
        let k0 = (cc >> 3) * 64 + 4 * ((cc & 7) >> 1) + 2 * (cc & 1);
        for q in 0..4 {
            let kk = k0 + 16 * q;
            if kk < k {
                let at = mm * kpad + cc * 8 + 2 * q;
                out[at] = act[mm * k + kk];
                out[at + 1] = act[mm * k + kk + 1];
            }
        }
    }
    out
}

/// Token tile and tile count for `m` tokens: the smallest instance that holds `m`, or tiles of
/// `tn_big` tokens beyond 256.
fn tiles_for(m: usize, tn_big: usize) -> (usize, usize) {
    match TN_VARIANTS.iter().find(|t| **t >= m) {
        Some(t) => (*t, 1),
        None => (tn_big, m.div_ceil(tn_big)),
    }
}

/// The CTA counts per token tile offered for `units` units of `groups` groups: the persistent
/// grid (`slots` resident CTAs over the tiles), one CTA per SM, one CTA per group (no split-K),
/// and, where they fit in one wave, 2, 4 and 8 CTAs per group (a few slices to reduce instead
/// of many: small N such as in_proj_ba's 96 rows); each at most `units`, deduplicated, largest
/// first.
pub fn grid_options(
    units: usize,
    groups: usize,
    slots: usize,
    sms: usize,
    tiles: usize,
) -> Vec<usize> {
    let wave = (slots / tiles).max(1);
    let mut v: Vec<usize> = [wave, (sms / tiles).max(1), groups]
        .into_iter()
        .chain(
            [2, 4, 8]
                .into_iter()
                .map(|f| f * groups)
                .filter(|c| *c <= wave),
        )
        .map(|c| c.clamp(1, units.max(1)))
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    v
}

/// Configurations of the kernel for `m` tokens of a weight with `strips` 16-row strips and
/// `kt_n` 64-wide k tiles: for each warpgroup count and pipeline depth whose shared memory fits,
/// the grids of [`grid_options`] (workspace at most [`WS_CAP_BYTES`]). Above 256 tokens the
/// tokens run as tiles of 256 and of 128 (grid.y).
///
/// # Errors
/// A failing occupancy query.
pub fn candidates(
    gpu: &Gpu,
    module: &Module,
    strips: usize,
    kt_n: usize,
    m: usize,
) -> anyhow::Result<Vec<Config>> {
    if m == 0 {
        return Ok(Vec::new());
    }
    let shapes: Vec<(usize, usize)> = if m > 256 {
        vec![tiles_for(m, 256), tiles_for(m, 128)]
    } else {
        vec![tiles_for(m, 256)]
    };
    let sms = gpu.sm_count.max(1) as usize;
    let pairs = kt_n / 2;
    let mut out = Vec::new();
    for (tn, tiles) in shapes {
        for (itn, wg, pipe) in instances() {
            if itn != tn {
                continue;
            }
            let kname = name(tn, wg, pipe);
            let attrs = module.attrs(&kname)?;
            if attrs.local_bytes > 0 {
                continue; // spills registers to local memory
            }
            let smem_max =
                (gpu.max_smem_optin as usize).saturating_sub(attrs.static_shared_bytes as usize);
            let groups = strips.div_ceil(group_strips(wg));
            let units = groups * pairs;
            for stages in STAGE_CHOICES {
                let smem = smem_bytes(tn, wg, stages);
                if smem > smem_max {
                    continue;
                }
                let occ = module.occupancy_smem(&kname, (wg * 128) as u32, smem as u32)? as usize;
                if occ == 0 {
                    continue;
                }
                for ctas in grid_options(units, groups, occ * sms, sms, tiles) {
                    let ws =
                        act_floats(tn, tiles, pairs) + ws_floats(tn, wg, ctas, tiles, units, pairs);
                    if ws * 4 > WS_CAP_BYTES {
                        continue;
                    }
                    let c = Config::Wg {
                        tn,
                        wg,
                        pipe,
                        stages,
                        ctas,
                        tiles,
                        smem,
                    };
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Scratch of a configuration on an `n`-row weight of `kt_n` k tiles: (workspace floats: the
/// permuted activations ([`act_floats`]) then the split-K slots ([`ws_floats`]), counters).
pub fn scratch(cfg: &Config, n: usize, kt_n: usize) -> (usize, usize) {
    match cfg {
        Config::Wg {
            tn,
            wg,
            ctas,
            tiles,
            ..
        } => {
            let groups = n.div_ceil(16).div_ceil(group_strips(*wg));
            let pairs = kt_n / 2;
            (
                act_floats(*tn, *tiles, pairs)
                    + ws_floats(*tn, *wg, *ctas, *tiles, groups * pairs, pairs),
                tiles * groups,
            )
        }
        _ => (0, 0),
    }
}

/// Queue one GEMM of configuration `cfg` (a [`Config::Wg`]) on `module` (kernels/w4a16_wg.cu),
/// which [`candidates`] offered on that module: the [`PERMUTE_KERNEL`] pre-pass (`act` →
/// the start of `ws`), then the GEMM reading the permuted copy. `ws` holds [`scratch`]'s floats.
///
/// # Errors
/// Not a wgmma configuration, M beyond its token tiles, or a launch failure.
#[allow(clippy::too_many_arguments)]
pub fn launch(
    gpu: &Gpu,
    module: &Module,
    w: &W4a16View,
    cfg: &Config,
    act: u64,
    out: u64,
    m: usize,
    ws: u64,
    counters: u64,
) -> anyhow::Result<()> {
    let Config::Wg {
        tn,
        wg,
        pipe,
        stages,
        ctas,
        tiles,
        smem,
    } = cfg
    else {
        anyhow::bail!("w4a16 wgmma: not a wgmma configuration: {cfg:?}");
    };
    anyhow::ensure!(
        m >= 1 && m <= tn * tiles,
        "w4a16 wgmma: M = {m} does not fit {tiles} tile(s) of {tn} tokens"
    );
    // The kernel's dynamic shared-memory limit was raised by the occupancy queries of
    // [`candidates`] (to its largest configuration), not here: a launch may be captured into a
    // CUDA graph.
    let kname = name(*tn, *wg, *pipe);
    let kpad = 64 * w.kt_n;
    let chunks = m * kpad / 8;
    crate::kernels::launchers::w4a16_wg::w4wg_permute_act(
        module,
        gpu,
        (
            dim(
                "chunks.div_ceil(PERMUTE_THREADS)",
                chunks.div_ceil(PERMUTE_THREADS),
            )?,
            1,
            1,
        ),
        (dim("PERMUTE_THREADS", PERMUTE_THREADS)?, 1, 1),
        0,
        DevPtr::at(act),
        DevPtr::at(ws),
        m,
        w.k,
        kpad,
    )?;
    let split_ws = ws + 4 * act_floats(*tn, *tiles, w.kt_n / 2) as u64;
    crate::kernels::launchers::w4a16_wg::gemm(
        module,
        gpu,
        &kname,
        (
            dim("*ctas", *ctas)?,
            dim("m.div_ceil(*tn)", m.div_ceil(*tn))?,
            1,
        ),
        (dim("*wg * 128", *wg * 128)?, 1, 1),
        dim("*smem", *smem)?,
        DevPtr::at(w.wq),
        DevPtr::at(w.sc),
        DevPtr::at(ws),
        DevPtr::at(out),
        DevPtr::at(split_ws),
        DevPtr::at(counters),
        m,
        w.n,
        w.k,
        w.strips,
        w.kt_n,
        *stages,
        w.out_scale,
    )?;
    Ok(())
}

/// A one-line description of a configuration (the report's path column).
pub fn describe(cfg: &Config) -> String {
    match cfg {
        Config::Wg {
            tn,
            wg,
            pipe,
            stages,
            ctas,
            tiles,
            ..
        } => format!(
            "rigbench W4A16 wgmma (sm_90a: E2M1→BF16 in registers as wgmma's A, tokens as its N = {tn}, activations permuted to the weights' K order by a pre-pass and staged by 16-byte cp.async into 128-byte-swizzled smem, {stages}-stage cp.async ring{}): {} rows/CTA, {ctas} CTAs × {tiles} token tile(s)",
            if *pipe { ", one wgmma group kept in flight" } else { "" },
            64 * wg
        ),
        _ => String::new(),
    }
}

/// Whether the kernel may be offered at all: compute capability 9.0 and not switched off.
pub fn wanted(gpu: &Gpu) -> Result<(), String> {
    if std::env::var(ENV_ENABLE).is_ok_and(|v| v.trim() == "off") {
        return Err(format!("{ENV_ENABLE}=off"));
    }
    if (gpu.cc.major, gpu.cc.minor) != (9, 0) {
        return Err(format!(
            "it needs an sm_90 card (wgmma, {WG_ARCH}); this one is {}",
            gpu.cc
        ));
    }
    Ok(())
}

/// Environment variable set for the probe's child process: a file holding the PTX the parent
/// compiled, loaded instead of compiling again.
pub const ENV_PTX: &str = "RIGBENCH_W4A16_WG_PTX";

/// Compile kernels/w4a16_wg.cu for [`WG_ARCH`] (or load the PTX file named by [`ENV_PTX`]);
/// returns the module and its PTX text.
///
/// # Errors
/// The compile failure, or an unreadable PTX file.
pub fn compile(gpu: &Gpu) -> anyhow::Result<(Module, String)> {
    let names = kernel_names();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    if let Ok(path) = std::env::var(ENV_PTX) {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {path} (set by {ENV_PTX})"))?;
        let m = gpu.load_ptx("w4a16_wg", &text, &refs, WG_ARCH)?;
        return Ok((m, text));
    }
    Ok(gpu.compile_for_ptx("w4a16_wg", WG_SRC, &refs, WG_ARCH, &[])?)
}

/// The wgmma module for device `device`, ready for the tuners, or why it is not offered (a
/// sentence for the notes): not an sm_90 card, switched off, a compile failure, or a failed
/// probe. Unless [`ENV_PROBE`] is `off`, every configuration is first run once in a child
/// process (`rigbench devcheck --only wg-probe`) and checked there, so that a kernel fault or
/// hang on this card cannot take the calling process's CUDA context with it; the verdict is
/// kept for the process's lifetime.
/// `Ok` carries a sentence for the notes: how it was compiled and the probe's verdict.
pub fn module_for(gpu: &Gpu, device: usize) -> Result<(W4Module, String), String> {
    wanted(gpu)?;
    let (module, ptx) =
        compile(gpu).map_err(|e| format!("kernels/w4a16_wg.cu failed to build: {e:#}"))?;
    let built = format!(
        "kernels/w4a16_wg.cu (wgmma) for {}: {}",
        module.arch,
        module.how_built()
    );
    let probed = if std::env::var(ENV_PROBE).is_ok_and(|v| v.trim() == "off") {
        format!("not probed ({ENV_PROBE}=off)")
    } else {
        format!(
            "probed in a child process: {}",
            probe_in_child_cached(device, &ptx)?
        )
    };
    Ok((
        W4Module {
            flavor: WG_FLAVOR.into(),
            defines: vec![format!("--gpu-architecture={WG_ARCH}")],
            module,
        },
        format!("{built}; {probed}"),
    ))
}

fn probe_in_child_cached(device: usize, ptx: &str) -> Result<String, String> {
    type Verdicts = Vec<(usize, Result<String, String>)>;
    static DONE: OnceLock<Mutex<Verdicts>> = OnceLock::new();
    let done = DONE.get_or_init(|| Mutex::new(Vec::new()));
    let mut g = done.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = g.iter().find(|(d, _)| *d == device) {
        return r.clone();
    }
    let r = probe_in_child(device, ptx, std::time::Duration::from_secs(180));
    g.push((device, r.clone()));
    r
}

/// Run `rigbench devcheck --only wg-probe --device DEVICE` as a child process of this binary
/// on the PTX text `ptx` (handed over in a file, [`ENV_PTX`]), killed after `limit`; `Ok` with
/// its summary line when it exits 0 after printing `PASS wg-probe`, else `Err` naming what
/// happened (exit status or signal, its last lines).
pub fn probe_in_child(
    device: usize,
    ptx: &str,
    limit: std::time::Duration,
) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let stem = exe
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if stem != "rigbench" {
        return Err(format!(
            "the wgmma probe runs `rigbench devcheck` in a child process, and this process is `{stem}`, not rigbench (set {ENV_PROBE}=off to use the kernel unprobed)"
        ));
    }
    let dir =
        std::env::temp_dir().join(format!("rigbench-wg-probe-{}-{device}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ptx_file = dir.join("w4a16_wg.ptx");
    std::fs::write(&ptx_file, ptx).map_err(|e| format!("{}: {e}", ptx_file.display()))?;
    let log = dir.join("probe.log");
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let file2 = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = std::process::Command::new(&exe)
        .args([
            "devcheck",
            "--only",
            "wg-probe",
            "--device",
            &device.to_string(),
        ])
        .env(ENV_PROBE, "off")
        .env(ENV_PTX, &ptx_file)
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(file2)
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", exe.display()))?;
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("did not finish within {} s", limit.as_secs()));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(e) => break Err(format!("waiting for it failed: {e}")),
        }
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let tail: Vec<&str> = text.lines().rev().take(6).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    let pass = text.lines().find(|l| l.starts_with("PASS wg-probe"));
    match (status, pass) {
        (Ok(s), Some(line)) if s.success() => Ok(line.to_string()),
        (Ok(s), _) => Err(format!(
            "the wgmma probe (child process `rigbench devcheck --only wg-probe`) failed ({s}): {}",
            tail.join(" | ")
        )),
        (Err(why), _) => Err(format!(
            "the wgmma probe (child process) {why}: {}",
            tail.join(" | ")
        )),
    }
}

/// Probe shapes (N, K) and token counts: a partial group (N = 96), K not a multiple of 128,
/// several groups and splits, and token tiles beyond one.
pub const PROBE_CASES: &[(usize, usize, &[usize])] = &[
    (96, 5120, &[1, 16, 64]),
    (200, 1040, &[3, 40, 130]),
    (512, 2048, &[8, 257, 300]),
];

/// One probe result line per (shape, M): configurations run, passed, and the worst rel_l2.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeCase {
    /// N.
    pub n: usize,
    /// K.
    pub k: usize,
    /// M.
    pub m: usize,
    /// Configurations run.
    pub configs: usize,
    /// Failures: (configuration, what failed).
    pub failed: Vec<(String, String)>,
    /// Largest rel_l2 among the passing configurations.
    pub worst_rel_l2: f64,
}

/// Run every configuration [`candidates`] offers on each of [`PROBE_CASES`] (random NVFP4
/// weights, BF16 activations), each against the exact CPU reference of the whole output
/// (rel_l2 under the W4A16 tolerance, no non-finite or unwritten output), twice, and bit-exact
/// between the two runs. Meant for a child process: a fault poisons this process's context.
///
/// # Errors
/// A device failure outside the kernel's own launches (allocation, copy).
pub fn probe(gpu: &Gpu, module: &Module) -> anyhow::Result<Vec<ProbeCase>> {
    use crate::kernels::data::{bf16_uniform, nvfp4_weight};
    let mut out = Vec::new();
    for &(n, k, ms) in PROBE_CASES {
        let w = nvfp4_weight(n, k, 0x77A1 ^ n as u32, 4);
        let p = crate::formats::w4a16_pack::repack(&w)?;
        let dev = super::w4a16::W4a16Device::upload(gpu, &p)?;
        let view = dev.view();
        for &m in ms {
            let seed = 0x5EED ^ (m as u32) ^ ((n as u32) << 8);
            let act: Vec<u16> = (0..m * k)
                .map(|i| half::bf16::from_f32(bf16_uniform(i as u32, seed, 1.0)).to_bits())
                .collect();
            let want = reference(&w, &act, m);
            let act_d = gpu.upload(&act)?;
            let out_d = gpu.alloc(m * n * 2)?;
            let cands = candidates(gpu, module, dev.strips, dev.kt_n, m)?;
            let (mut ws_f, mut ctr) = (1usize, 1usize);
            for c in &cands {
                let (a, b) = scratch(c, n, dev.kt_n);
                ws_f = ws_f.max(a);
                ctr = ctr.max(b);
            }
            let ws = gpu.alloc(ws_f * 4)?;
            let counters = gpu.alloc(ctr * 4)?;
            gpu.memset(&counters, 0)?;
            let mut case = ProbeCase {
                n,
                k,
                m,
                configs: cands.len(),
                failed: Vec::new(),
                worst_rel_l2: 0.0,
            };
            for c in &cands {
                let mut first: Option<Vec<u16>> = None;
                let mut verdict = Ok(0.0f64);
                for _ in 0..2 {
                    gpu.memset(&out_d, 0xFF)?;
                    if let Err(e) = launch(
                        gpu,
                        module,
                        &view,
                        c,
                        act_d.ptr(),
                        out_d.ptr(),
                        m,
                        ws.ptr(),
                        counters.ptr(),
                    )
                    .and_then(|_| Ok(gpu.sync()?))
                    {
                        verdict = Err(format!("{e:#}"));
                        break;
                    }
                    let got: Vec<u16> = gpu.download(&out_d, 0, m * n)?;
                    if let Some(f) = &first {
                        if *f != got {
                            let d = f.iter().zip(&got).filter(|(a, b)| a != b).count();
                            verdict = Err(format!("{d} outputs differ between two runs"));
                        }
                        break;
                    }
                    let nonfinite = got
                        .iter()
                        .filter(|b| !half::bf16::from_bits(**b).to_f32().is_finite())
                        .count();
                    let g: Vec<f64> = got
                        .iter()
                        .map(|b| half::bf16::from_bits(*b).to_f64())
                        .collect();
                    let e = crate::kernels::reference::rel_l2(&g, &want);
                    if nonfinite > 0
                        || e.is_nan()
                        || e > crate::kernels::reference::W4A16_GEMM_REL_L2
                    {
                        verdict = Err(format!("rel_l2 {e:.3e}, {nonfinite} non-finite outputs"));
                        break;
                    }
                    verdict = Ok(e);
                    first = Some(got);
                }
                match verdict {
                    Ok(e) => case.worst_rel_l2 = case.worst_rel_l2.max(e),
                    Err(why) => case.failed.push((describe(c), why)),
                }
            }
            out.push(case);
        }
    }
    Ok(out)
}

/// The exact product of the NVFP4 weight and BF16 activations (`act` as BF16 bits, `[m, k]`),
/// `[m, n]` row-major.
fn reference(w: &crate::formats::nvfp4::Nvfp4Weight, act: &[u16], m: usize) -> Vec<f64> {
    let (n, k) = (w.n, w.k);
    let wf: Vec<f64> = (0..n * k).map(|i| w.value_f64(i / k, i % k)).collect();
    let af: Vec<f64> = act
        .iter()
        .map(|b| half::bf16::from_bits(*b).to_f64())
        .collect();
    let mut out = vec![0f64; m * n];
    for mi in 0..m {
        for ni in 0..n {
            out[mi * n + ni] = (0..k).map(|kk| wf[ni * k + kk] * af[mi * k + kk]).sum();
        }
    }
    out
}

/// The launch parameters [`emulate`] mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmuLaunch {
    /// Token tile (wgmma N).
    pub tn: usize,
    /// Warpgroups per CTA.
    pub wg: usize,
    /// The `_p` instance: loads run stages − 2 ahead, one wgmma group stays in flight.
    pub pipe: bool,
    /// Pipeline stages.
    pub stages: usize,
    /// CTAs per token tile.
    pub ctas: usize,
}

/// Opt-in shared memory per block of an H200 (227 KiB), the limit [`emulate`] checks.
pub const H200_SMEM_OPTIN: usize = 232_448;

/// Shared-memory address of the dynamic buffer in the emulation (the kernel's 16 bytes of
/// static shared memory come first); the kernel aligns its ring up from it.
const EMU_RAW: u32 = 16;

/// The 128-byte swizzle as the hardware applies it to a shared address: 16-byte chunk bits
/// 4..6 XOR row bits 7..9 (PTX ISA, "Shared Memory Matrix Layout", swizzling modes; CUTLASS
/// `Swizzle<3,4,3>`).
fn swizzle128(addr: u32) -> u32 {
    addr ^ (((addr >> 7) & 7) << 4)
}

/// The kernel's `desc_b`.
fn desc_b(addr: u32) -> u64 {
    ((addr >> 4) & 0x3FFF) as u64 | (1u64 << 16) | (64u64 << 32) | (1u64 << 62)
}

/// Shared address of element (k, n), k < 16, of wgmma's K-major B operand described by `desc`
/// (PTX ISA, "Matrix Descriptor Format" and the canonical K-major layouts; CUTLASS
/// `make_gmma_desc<Major::K>`: `Swizzle<3,4,3> o ((8,n),2):((8T,SBO),1)` in 16-byte units for
/// the 128-byte swizzle).
fn b_element_addr(desc: u64, k: usize, n: usize) -> u32 {
    let start = ((desc & 0x3FFF) as u32) << 4;
    let sbo = (((desc >> 32) & 0x3FFF) as u32) << 4;
    let layout = (desc >> 62) as u32;
    let base_offset = ((desc >> 49) & 7) as u32;
    assert_eq!(
        (layout, base_offset),
        (1, 0),
        "only the 128-byte swizzle with base offset 0 is modelled"
    );
    let linear = start + (n as u32 / 8) * sbo + (n as u32 % 8) * 128 + 2 * k as u32;
    swizzle128(linear)
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Emulate one launch of `kernels/w4a16_wg.cu` on the CPU: `act` is `[m, p.k]` BF16 bits
/// (row stride K, as on the GPU); returns the `[m, p.n]` outputs before the kernel's final BF16
/// rounding (`Σ · out_scale` in f64), computed through the kernel's own index math: the
/// stripes and segments, the pre-pass that writes the activations in the packed K order
/// ([`permute_act`]), the cp.async destinations of codes, scales and activations in a byte
/// model of shared memory, the dequantization of each lane's fragments, each wgmma
/// reading A from the lanes' registers (the m16n8k16 A layout per warp) and B through the
/// shared-memory descriptor, the accumulator layout, and the split-K slots and their
/// slice-order reduction by the last CTA to arrive. CTAs of a token tile run one after another
/// in `order` (a permutation of `0..ctas`), which decides who arrives last; the result must not
/// depend on it.
///
/// # Panics
/// Parameters the kernel does not take (e.g. `tn` not an instance, `ctas` larger than the
/// units, `order` not a permutation); an out-of-bounds shared-memory or workspace access.
pub fn emulate(p: &W4a16Packed, act: &[u16], m: usize, l: EmuLaunch, order: &[usize]) -> Vec<f64> {
    let EmuLaunch {
        tn,
        wg,
        pipe,
        stages,
        ctas,
    } = l;
    assert!(instances().contains(&(tn, wg, pipe)));
    assert!((2..=8).contains(&stages) && (!pipe || stages >= 3));
    // The H200's opt-in shared memory per block (and the descriptor's 14-bit start address,
    // 256 KiB, would wrap beyond it).
    assert!(
        smem_bytes(tn, wg, stages) <= H200_SMEM_OPTIN,
        "{l:?} needs {} bytes of shared memory",
        smem_bytes(tn, wg, stages)
    );
    // Tiles loaded ahead (the kernel's `ahead`), and how many iterations after its last read a
    // stage may be reloaded: 1 when every wgmma is waited for within its iteration, 2 when one
    // commit group stays in flight into the next.
    let ahead = if pipe { stages - 2 } else { stages - 1 };
    let reuse_gap = if pipe { 2 } else { 1 };
    let (n, k) = (p.n, p.k);
    let strips = p.strips();
    let kt_n = p.k_tiles();
    let gs = group_strips(wg);
    let rows = gs * 16;
    let a_tile = tn * 128;
    let w_off = 2 * a_tile;
    let s_off = w_off + gs * 1024;
    let stage = stage_bytes(tn, wg);
    let pairs = kt_n / 2;
    let groups = strips.div_ceil(gs);
    let units = groups * pairs;
    assert!(ctas >= 1 && ctas <= units, "ctas {ctas} units {units}");
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..ctas).collect::<Vec<_>>(),
        "order is a permutation"
    );
    let tiles = m.div_ceil(tn);
    // The pre-pass: the activations in the packed K order, row stride kpad.
    let kpad = 64 * kt_n;
    let actp = permute_act(act, m, k, kpad);
    let sbase = (EMU_RAW + 1023) & !1023;
    let smem_len = (sbase - EMU_RAW) as usize + stages * stage;
    let g = Emu {
        l,
        p,
        actp: &actp,
        ahead,
        reuse_gap,
        n,
        strips,
        kt_n,
        gs,
        rows,
        a_tile,
        w_off,
        s_off,
        stage,
        pairs,
        groups,
        units,
        kpad,
        sbase,
    };
    let mut out = vec![f64::NAN; m * n];
    let mut ws = vec![f64::NAN; tiles * ctas * 2 * rows * tn];
    let mut counters = vec![0u32; tiles * groups];
    for tile in 0..tiles {
        let tok0 = tile * tn;
        let mt = tn.min(m - tok0);
        for &c in order {
            // One CTA. Shared memory, indexed by shared address − EMU_RAW; NaN-like garbage.
            let mut smem = vec![0xFFu8; smem_len];
            let (u_begin, u_end) = stripe(c, units, ctas);
            // Zero the token rows never loaded.
            let per_tile = (tn - mt) * 8;
            for i in 0..stages * 2 * per_tile {
                let (tl, r) = (i / per_tile, i % per_tile);
                let at = sh(sbase)
                    + (tl >> 1) * stage
                    + (tl & 1) * a_tile
                    + (mt + (r >> 3)) * 128
                    + (r & 7) * 16;
                smem[at..at + 16].fill(0);
            }
            let mut u = u_begin;
            while u < u_end {
                let grp = u / pairs;
                let pa = u % pairs;
                let pb = pairs.min(pa + (u_end - u));
                let np = pb - pa;
                let strip0 = grp * gs;
                let span = EmuSpan {
                    tile,
                    c,
                    tok0,
                    mt,
                    grp,
                    strip0,
                    pa,
                    pb,
                    np,
                    later: u != u_begin,
                };
                let acc = emu_mainloop(&g, &span, &mut smem);
                // Epilogue.
                emu_epilogue(&g, &span, &acc, &mut out, &mut ws, &mut counters);
                u += np;
            }
        }
    }
    assert!(counters.iter().all(|c| *c == 0), "counters left non-zero");
    out
}

/// Index into the emulation's shared-memory bytes of the shared address `addr`.
fn sh(addr: u32) -> usize {
    (addr - EMU_RAW) as usize
}

/// One launch of [`emulate`]: its parameters, the packed weights, the permuted activations,
/// and the geometry the kernel derives from them (same names as in the kernel).
struct Emu<'a> {
    l: EmuLaunch,
    p: &'a W4a16Packed,
    /// The activations in the packed K order, row stride `kpad`.
    actp: &'a [u16],
    ahead: usize,
    reuse_gap: usize,
    n: usize,
    strips: usize,
    kt_n: usize,
    gs: usize,
    rows: usize,
    a_tile: usize,
    w_off: usize,
    s_off: usize,
    stage: usize,
    pairs: usize,
    groups: usize,
    units: usize,
    kpad: usize,
    sbase: u32,
}

/// The K-tile pairs `pa..pb` of group `grp` one CTA (`c`) runs for token tile `tile`.
struct EmuSpan {
    tile: usize,
    c: usize,
    tok0: usize,
    /// Tokens of the tile.
    mt: usize,
    grp: usize,
    strip0: usize,
    pa: usize,
    pb: usize,
    np: usize,
    /// Not the CTA's first span (its second split-K slot).
    later: bool,
}

/// `acc[warp][lane][r]`, the wgmma D fragments of each warp of a CTA.
type EmuAcc = Vec<Vec<Vec<f64>>>;

/// The A registers of a warpgroup's 4 warps: `a[h][warp][lane][j][reg]`.
type EmuFrags = Vec<Vec<Vec<[[u32; 4]; 4]>>>;

/// The main loop of one CTA over its span: stages loaded `ahead` (a stage reloaded only once
/// its reads are done), each iteration's fragments dequantized and its wgmmas run.
fn emu_mainloop(g: &Emu<'_>, span: &EmuSpan, smem: &mut [u8]) -> EmuAcc {
    let EmuLaunch { tn, wg, stages, .. } = g.l;
    let l = g.l;
    let (gs, ahead, reuse_gap, stage, sbase, a_tile) =
        (g.gs, g.ahead, g.reuse_gap, g.stage, g.sbase, g.a_tile);
    let (pa, np) = (span.pa, span.np);
    // acc[warp][lane][r], the wgmma D fragments of each warp.
    let mut acc = vec![vec![vec![0f64; tn / 2]; 32]; gs];
    // Iteration that last read each stage (the wgmmas' asynchronous reads included).
    let mut last_read: Vec<Option<usize>> = vec![None; stages];
    for s in 0..ahead {
        if s < np {
            emu_load(g, span, smem, s, pa + s);
        }
    }
    for i in 0..np {
        let nxt = i + ahead;
        if nxt < np {
            let st = nxt % stages;
            assert!(
                last_read[st].is_none_or(|r| r + reuse_gap <= i),
                "{l:?}: iteration {i} reloads stage {st} while iteration {:?} may still read it",
                last_read[st]
            );
            emu_load(g, span, smem, st, pa + nxt);
        }
        let st = i % stages;
        last_read[st] = Some(i);
        let b = sh(sbase) + st * stage;
        let bs = sbase + (st * stage) as u32;
        for warpgroup in 0..wg {
            let a = emu_fragments(g, smem, b, warpgroup);
            for (h, ah) in a.iter().enumerate() {
                for j in 0..4 {
                    let desc = desc_b(bs + (h * a_tile + 32 * j) as u32);
                    wgmma(
                        &mut acc[4 * warpgroup..4 * warpgroup + 4],
                        ah,
                        j,
                        tn,
                        |kk, nn| {
                            let at = sh(b_element_addr(desc, kk, nn));
                            half::bf16::from_bits(u16::from_le_bytes([smem[at], smem[at + 1]]))
                                .to_f64()
                        },
                    );
                }
            }
        }
    }
    acc
}

/// One stage's cp.async loads (stage `st`, K-tile pair `pp`): the group's code strips and
/// scales (zeros for strips past the last), and the tile's tokens' activations, swizzled.
fn emu_load(g: &Emu<'_>, span: &EmuSpan, smem: &mut [u8], st: usize, pp: usize) {
    let Emu {
        p,
        actp,
        gs,
        strips,
        kt_n,
        w_off,
        s_off,
        stage,
        pairs,
        kpad,
        sbase,
        a_tile,
        ..
    } = *g;
    let (strip0, mt, tok0) = (span.strip0, span.mt, span.tok0);
    let base = sbase + (st * stage) as u32;
    for i in 0..gs * 64 {
        let (r, ch) = (i >> 6, i & 63);
        let strip = strip0 + r;
        let ok = strip < strips;
        let src = ((if ok { strip } else { 0 }) * kt_n + 2 * pp) * 512 + ch * 16;
        let dst = sh(base + (w_off + r * 1024 + ch * 16) as u32);
        if ok {
            smem[dst..dst + 16].copy_from_slice(&p.weights[src..src + 16]);
        } else {
            smem[dst..dst + 16].fill(0);
        }
    }
    for i in 0..gs * 8 {
        let (r, part) = (i >> 3, i & 7);
        let strip = strip0 + r;
        let ok = strip < strips;
        let src = (((if ok { strip } else { 0 }) * pairs + pp) * 32 + part * 4) * 4;
        let dst = sh(base + (s_off + r * 128 + part * 16) as u32);
        if ok {
            smem[dst..dst + 16].copy_from_slice(&p.scales[src..src + 16]);
        } else {
            smem[dst..dst + 16].fill(0);
        }
    }
    for i in 0..mt * 16 {
        let (mm, h, ch) = (i >> 4, (i >> 3) & 1, i & 7);
        let src = (tok0 + mm) * kpad + (2 * pp + h) * 64 + ch * 8;
        let dst = sh(base + (h * a_tile + mm * 128 + ((ch ^ (mm & 7)) << 4)) as u32);
        for e in 0..8 {
            smem[dst + 2 * e..dst + 2 * e + 2].copy_from_slice(&actp[src + e].to_le_bytes());
        }
    }
}

/// The A fragments of `warpgroup`'s 4 warps, dequantized from the stage at byte `b` of shared
/// memory: each lane's codes times its scales (`mul.bf16x2`).
fn emu_fragments(g: &Emu<'_>, smem: &[u8], b: usize, warpgroup: usize) -> EmuFrags {
    let (s_off, w_off) = (g.s_off, g.w_off);
    // Registers of the group's 4 warps: a[h][warp][lane][j][reg].
    let mut a = vec![vec![vec![[[0u32; 4]; 4]; 32]; 4]; 2];
    for wq in 0..4 {
        let warp = 4 * warpgroup + wq;
        for lane in 0..32 {
            let sw = read_u32(smem, b + s_off + warp * 128 + lane * 4);
            for (h, ah) in a.iter_mut().enumerate() {
                let wbase = b + w_off + warp * 1024 + 512 * h + lane * 16;
                let lo = scale_bf16_bits(sw.to_le_bytes()[2 * h]);
                let hi = scale_bf16_bits(sw.to_le_bytes()[2 * h + 1]);
                for (j, regs) in ah[wq][lane].iter_mut().enumerate() {
                    let q = read_u32(smem, wbase + 4 * j);
                    for (r, reg) in regs.iter_mut().enumerate() {
                        let pair = extract_reg(q, r);
                        // scale2: the scale's BF16 in both halves.
                        let s = if r % 2 == 0 { lo } else { hi } as u32;
                        *reg = bf16x2_mul(pair, s | (s << 16));
                    }
                }
            }
        }
    }
    a
}

/// The epilogue of a span: a span covering its group's whole K writes the outputs; a split
/// one writes its slot of the workspace, and the last of the group's CTAs to arrive sums the
/// slots in slice order into the outputs and resets the group's counter.
fn emu_epilogue(
    g: &Emu<'_>,
    span: &EmuSpan,
    acc: &[Vec<Vec<f64>>],
    out: &mut [f64],
    ws: &mut [f64],
    counters: &mut [u32],
) {
    let EmuLaunch { tn, ctas, .. } = g.l;
    let (p, n, rows, pairs, groups, units) = (g.p, g.n, g.rows, g.pairs, g.groups, g.units);
    let EmuSpan {
        tile,
        c,
        tok0,
        mt,
        grp,
        strip0,
        pa,
        pb,
        later,
        ..
    } = *span;
    let frag = |warp: usize, lane: usize, r: usize| {
        let (g, t) = (lane >> 2, lane & 3);
        (
            warp * 16 + g + 8 * ((r >> 1) & 1),
            8 * (r >> 2) + 2 * t + (r & 1),
        )
    };
    if pa == 0 && pb == pairs {
        for (warp, aw) in acc.iter().enumerate() {
            for (lane, al) in aw.iter().enumerate() {
                for (r, v) in al.iter().enumerate() {
                    let (row, mm) = frag(warp, lane, r);
                    let nn = strip0 * 16 + row;
                    if nn < n && mm < mt {
                        out[(tok0 + mm) * n + nn] = v * p.out_scale as f64;
                    }
                }
            }
        }
    } else {
        let first = v2_owner(grp * pairs, units, ctas);
        let last = v2_owner(grp * pairs + pairs - 1, units, ctas);
        let slices = last - first + 1;
        let gi = tile * groups + grp;
        let slot = ((tile * ctas + c) * 2 + usize::from(later)) * rows * tn;
        for (warp, aw) in acc.iter().enumerate() {
            for (lane, al) in aw.iter().enumerate() {
                for (r, v) in al.iter().enumerate() {
                    let (row, mm) = frag(warp, lane, r);
                    if mm < mt {
                        ws[slot + mm * rows + row] = *v;
                    }
                }
            }
        }
        let prev = counters[gi];
        counters[gi] += 1;
        if prev == (slices - 1) as u32 {
            let first_part = usize::from(stripe(first, units, ctas).0 < grp * pairs);
            for idx in 0..rows * mt {
                let (mm, row) = (idx / rows, idx % rows);
                let nn = strip0 * 16 + row;
                let mut s = 0f64;
                for q in first..=last {
                    let part = if q == first { first_part } else { 0 };
                    s += ws[((tile * ctas + q) * 2 + part) * rows * tn + idx];
                }
                if nn < n {
                    out[(tok0 + mm) * n + nn] = s * p.out_scale as f64;
                }
            }
            counters[gi] = 0;
        }
    }
}

/// `mul.rn.bf16x2` of two BF16 pairs (exact for the products the kernel forms).
fn bf16x2_mul(a: u32, b: u32) -> u32 {
    let one = |x: u16, y: u16| {
        let v = half::bf16::from_bits(x).to_f32() * half::bf16::from_bits(y).to_f32();
        half::bf16::from_f32(v).to_bits() as u32
    };
    one(a as u16, b as u16) | (one((a >> 16) as u16, (b >> 16) as u16) << 16)
}

/// One wgmma m64n`tn`k16 of a warpgroup: A from its 4 warps' registers `a[warp][lane][j]`
/// (per warp, the m16n8k16 A layout: register r of lane (g, t) holds row g + 8·(r % 2), k
/// columns 2t + 8·(r / 2) + {0, 1}, low half first; PTX ISA wgmma register fragments, CUTLASS
/// `ALayout_64x16`), B through `b(k, n)`, accumulated into `acc[warp][lane][r]` (D: row
/// 16·warp + g + 8·((r / 2) % 2), column 8·(r / 4) + 2t + r % 2; CUTLASS `CLayout_64xN`).
#[allow(clippy::type_complexity)]
fn wgmma(
    acc: &mut [Vec<Vec<f64>>],
    a: &[Vec<[[u32; 4]; 4]>],
    j: usize,
    tn: usize,
    b: impl Fn(usize, usize) -> f64,
) {
    // The 64 × 16 A tile as values.
    let mut av = [[0f64; 16]; 64];
    for (warp, aw) in a.iter().enumerate() {
        for (lane, regs) in aw.iter().enumerate() {
            let (g, t) = (lane >> 2, lane & 3);
            for (r, pair) in regs[j].iter().enumerate() {
                for e in 0..2 {
                    let row = 16 * warp + g + 8 * (r % 2);
                    let col = 2 * t + 8 * (r / 2) + e;
                    av[row][col] = half::bf16::from_bits((pair >> (16 * e)) as u16).to_f64();
                }
            }
        }
    }
    let bv: Vec<Vec<f64>> = (0..16)
        .map(|kk| (0..tn).map(|nn| b(kk, nn)).collect())
        .collect();
    for (warp, aw) in acc.iter_mut().enumerate() {
        for (lane, regs) in aw.iter_mut().enumerate() {
            let (g, t) = (lane >> 2, lane & 3);
            for (r, d) in regs.iter_mut().enumerate() {
                let row = 16 * warp + g + 8 * ((r >> 1) & 1);
                let col = 8 * (r >> 2) + 2 * t + (r & 1);
                *d += (0..16).map(|kk| av[row][kk] * bv[kk][col]).sum::<f64>();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::nvfp4;

    fn seeded(seed: u32, n: usize) -> Vec<f32> {
        (0..n as u32)
            .map(|i| crate::kernels::data::uniform_pm1(i, seed))
            .collect()
    }

    /// Emulate `l` on an `n × k` weight and `m` tokens, in two CTA arrival orders, and check the
    /// outputs against the exact reference and each other.
    fn check(n: usize, k: usize, m: usize, l: EmuLaunch) {
        let mut w = nvfp4::quantize(&seeded(11 ^ n as u32, n * k), n, k).unwrap();
        // A zero and a negative block scale: the repack's handling must survive the new path.
        w.block_scales[0] = 0;
        w.block_scales[1] |= 0x80;
        let p = crate::formats::w4a16_pack::repack(&w).unwrap();
        let a_raw = seeded(5 ^ m as u32, m * k);
        let act: Vec<u16> = a_raw
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        let want = reference(&w, &act, m);
        let fwd: Vec<usize> = (0..l.ctas).collect();
        let rev: Vec<usize> = (0..l.ctas).rev().collect();
        let got = emulate(&p, &act, m, l, &fwd);
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= 1e-9 * (1.0 + r.abs()),
                "{l:?} n={n} k={k} m={m}: output (token {}, row {}) = {g}, reference {r}",
                i / n,
                i % n
            );
        }
        let again = emulate(&p, &act, m, l, &rev);
        assert!(
            got.iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{l:?}: the split-K reduction depends on which CTA arrives last"
        );
    }

    #[test]
    fn emulated_wgmma_kernel_matches_reference_one_cta() {
        // N = 24: one group of 4 strips, 2 of them padding; K = 80: k tail inside the only pair.
        check(
            24,
            80,
            3,
            EmuLaunch {
                tn: 8,
                wg: 1,
                pipe: false,
                stages: 3,
                ctas: 1,
            },
        );
    }

    #[test]
    fn emulated_wgmma_kernel_matches_reference_split_k_and_groups() {
        // 13 strips: 4 groups of 4 (WG = 1) or 2 of 8 (WG = 2); K = 640: 5 pairs; stripes that
        // start and end inside groups; one CTA walking every group through a 2-stage ring;
        // several token tiles with a partial last one; the `_p` ring (loads 2 fewer ahead).
        for (tn, wg, pipe, stages, ctas, m) in [
            (8, 1, false, 2, 7, 1),
            (16, 1, false, 2, 1, 9),
            (16, 2, false, 3, 3, 40),
            (32, 1, false, 4, 20, 20),
            (64, 2, false, 6, 4, 64),
            (64, 1, true, 3, 3, 50),
            (64, 2, true, 4, 1, 64),
        ] {
            check(
                200,
                640,
                m,
                EmuLaunch {
                    tn,
                    wg,
                    pipe,
                    stages,
                    ctas,
                },
            );
        }
    }

    #[test]
    fn emulated_wgmma_kernel_large_token_tiles() {
        // TN = 128 and 256 (one and two token tiles), K not a multiple of 128.
        check(
            64,
            208,
            130,
            EmuLaunch {
                tn: 128,
                wg: 1,
                pipe: false,
                stages: 2,
                ctas: 2,
            },
        );
        check(
            40,
            128,
            300,
            EmuLaunch {
                tn: 256,
                wg: 2,
                pipe: false,
                stages: 2,
                ctas: 1,
            },
        );
        check(
            64,
            1024,
            200,
            EmuLaunch {
                tn: 256,
                wg: 1,
                pipe: true,
                stages: 3,
                ctas: 1,
            },
        );
    }

    #[test]
    fn names_match_the_cuda_source_and_sizes_fit_hopper() {
        for (tn, wg, pipe) in instances() {
            let mac = if pipe {
                "W4WG_PIPE_KERNEL"
            } else {
                "W4WG_KERNEL"
            };
            let inst = format!("{mac}({tn}, {wg})");
            assert!(WG_SRC.contains(&inst), "{inst} missing from w4a16_wg.cu");
            assert!(WG_SRC.contains(&format!("wgmma_m64n{tn}(")));
            // Three stages fit the H200's 227 KiB of opt-in shared memory.
            assert!(smem_bytes(tn, wg, 3) <= H200_SMEM_OPTIN, "{tn} {wg}");
        }
        assert_eq!(instances().len(), 18);
        // The module loads the pre-pass with the GEMM instances.
        assert_eq!(kernel_names().len(), 19);
        assert!(kernel_names().iter().any(|k| k == PERMUTE_KERNEL));
        assert!(WG_SRC.contains(&format!(
            "void __launch_bounds__({PERMUTE_THREADS}) {PERMUTE_KERNEL}("
        )));
        // Stage = 2 activation tiles + codes + scales, rounded to 1 KiB.
        assert_eq!(stage_bytes(16, 1), 9216);
        assert_eq!(stage_bytes(64, 2), 25600);
        assert_eq!(stage_bytes(256, 2), 74752);
    }

    #[test]
    fn descriptor_fields_and_swizzle() {
        let d = desc_b(0x2400 + 64);
        assert_eq!(d & 0x3FFF, (0x2400 + 64) >> 4);
        assert_eq!((d >> 16) & 0x3FFF, 1, "leading byte offset (unused)");
        assert_eq!((d >> 32) & 0x3FFF, 64, "stride byte offset 1024 >> 4");
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        // Row r of an 8-row atom: chunk c lands at chunk c ^ r.
        for r in 0..8u32 {
            for c in 0..8u32 {
                assert_eq!(
                    swizzle128(1024 + r * 128 + c * 16),
                    1024 + r * 128 + (c ^ r) * 16
                );
            }
        }
        // Element (k, n) of step j: where the kernel's 16-byte copy put position 16j + k of
        // token n's permuted k tile (chunk (16j + k) / 8, swizzled by the row).
        for n in 0..16usize {
            for j in 0..4usize {
                for kk in 0..16 {
                    let at = b_element_addr(desc_b(2048 + 32 * j as u32), kk, n);
                    let pos = 16 * j + kk;
                    let want = 2048 + n * 128 + (((pos / 8) ^ (n & 7)) << 4) + 2 * (pos % 8);
                    assert_eq!(at as usize, want, "n {n} j {j} k {kk}");
                }
            }
        }
    }

    #[test]
    fn permuted_activations_follow_the_packed_k_order() {
        // The documented order is a permutation of each k tile.
        let mut seen: Vec<usize> = (0..64).map(permuted_k_offset).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>());
        // The pre-pass mirror puts actual k = 64·tile + permuted_k_offset(pos) at position pos,
        // zeros past K (K = 80: one full tile, one with 16 values; kpad 128; and K = 200).
        for (m, k, kpad) in [(3usize, 80usize, 128usize), (2, 200, 256)] {
            let act: Vec<u16> = (0..m * k).map(|i| i as u16 + 1).collect();
            let got = permute_act(&act, m, k, kpad);
            for mm in 0..m {
                for pos in 0..kpad {
                    let kk = pos / 64 * 64 + permuted_k_offset(pos % 64);
                    let want = if kk < k { act[mm * k + kk] } else { 0 };
                    assert_eq!(got[mm * kpad + pos], want, "m {mm} pos {pos} k {k}");
                }
            }
        }
        // Against the packed weights' own order: MMA position p of step j in the test's formula
        // above is the unit layout of src/formats/w4a16_pack.rs.
        assert_eq!(permuted_k_offset(0), 0);
        assert_eq!(permuted_k_offset(2), 16);
        assert_eq!(permuted_k_offset(8), 2);
        assert_eq!(permuted_k_offset(16), 4);
        assert_eq!(permuted_k_offset(63), 63);
    }

    #[test]
    fn grids_stripes_and_workspace() {
        // Every unit owned once, in order; split detection.
        for (units, ctas) in [(80, 80), (80, 2), (200, 132), (7, 3)] {
            let mut next = 0;
            for c in 0..ctas {
                let (b, e) = stripe(c, units, ctas);
                assert_eq!(b, next);
                assert!(e > b, "no empty stripe when ctas <= units");
                next = e;
            }
            assert_eq!(next, units);
        }
        // Two groups of 40 pairs: two CTAs split nothing, three or eighty do.
        assert!(!any_split(80, 40, 2));
        assert!(any_split(80, 40, 3) && any_split(80, 40, 80));
        // Five groups over 132 CTAs, one group over 3 CTAs.
        assert!(any_split(200, 40, 132) && any_split(7, 7, 3));
        assert!(!any_split(200, 40, 5) && !any_split(200, 40, 1));
        assert_eq!(ws_floats(16, 1, 2, 1, 80, 40), 0);
        assert_eq!(ws_floats(16, 1, 3, 1, 80, 40), 3 * 2 * 64 * 16);
        // Grid options: persistent, per SM, per group; clamped to the units, largest first.
        assert_eq!(
            grid_options(1600, 40, 264, 132, 1),
            vec![264, 160, 132, 80, 40]
        );
        assert_eq!(grid_options(80, 2, 528, 132, 1), vec![80, 16, 8, 4, 2]);
        assert_eq!(grid_options(1600, 40, 264, 132, 4), vec![66, 40, 33]);
        assert_eq!(tiles_for(1, 256), (8, 1));
        assert_eq!(tiles_for(17, 256), (32, 1));
        assert_eq!(tiles_for(1024, 256), (256, 4));
        assert_eq!(tiles_for(300, 128), (128, 3));
    }
}
