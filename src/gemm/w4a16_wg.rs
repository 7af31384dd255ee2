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
//! uses the kernel ([`module_for`]). The probe's in-process half (what the child runs,
//! `kernels::impls::w4a16_wg::probe`) and the CPU emulation of one launch
//! (`kernels::impls::w4a16_wg::emulate`) are the kernel bench's.

use crate::gpu::dim;
use std::sync::{Mutex, OnceLock};

use anyhow::Context;

use super::w4a16::{Config, W4a16View};
use crate::gemm::W4Module;
use crate::gpu::{DevPtr, Gpu, Module};

/// Source of the kernel.
pub const WG_SRC: &str = include_str!("../../kernels/w4a16_wg.cu");
/// Flavour name of its module among the compiled [`W4Module`]s.
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
    super::launchers::w4a16_wg::w4wg_permute_act(
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
    super::launchers::w4a16_wg::gemm(
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

/// Opt-in shared memory per block of an H200 (227 KiB), the limit the CPU emulation
/// (`kernels::impls::w4a16_wg::emulate`) checks.
pub const H200_SMEM_OPTIN: usize = 232_448;

#[cfg(test)]
mod tests {
    use super::*;

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
