//! The typed kernel launchers against the kernel sources they launch (see
//! docs/architecture.md, "GPU layer"): each `extern "C" __global__` kernel of `kernels/*.cu`
//! has exactly one launcher, with its parameters' names and C types in order. Needs no GPU and
//! no CUDA toolkit; the PTX half of the check (the `.param` list NVRTC emits) runs in
//! `tests/it/kernel_sources.rs`, which already compiles every source when libnvrtc is present.

use rigbench::gpu::launch::{compare_with_source, name_matches, parse_cuda_kernels, KernelSig};

/// Every launcher declaration of the repository.
fn all_signatures() -> Vec<KernelSig> {
    [
        rigbench::gpu::util_kernels::SIGNATURES.to_vec(),
        rigbench::gemm::launchers::signatures(),
        rigbench::runtime::backend::cuda::launchers::signatures(),
    ]
    .concat()
}

/// Every kernel of `kernels/*.cu` against the launcher declarations `sigs`: the number of
/// kernels parsed and one line per problem (a kernel without a launcher or with several, a
/// parameter list that differs, a launcher without its kernel).
fn check(sigs: &[KernelSig]) -> (usize, Vec<String>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} is not readable: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "kernels/*.cu: {files:?}");
    let mut problems = Vec::new();
    let mut used = vec![false; sigs.len()];
    let mut kernels_seen = 0;
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(f).expect("readable");
        let kernels = parse_cuda_kernels(&src).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(!kernels.is_empty(), "{}: no kernel found", f.display());
        for k in &kernels {
            kernels_seen += 1;
            let matching: Vec<usize> = (0..sigs.len())
                .filter(|&i| sigs[i].source == stem && name_matches(sigs[i].name, &k.name))
                .collect();
            match matching.as_slice() {
                [] => problems.push(format!(
                    "kernels/{stem}.cu: kernel {} has no launcher (declare one with \
                     kernel_launchers!)",
                    k.name
                )),
                [i] => {
                    used[*i] = true;
                    problems.extend(compare_with_source(&sigs[*i], k));
                }
                many => problems.push(format!(
                    "kernels/{stem}.cu: kernel {} matches {} launchers: {:?}",
                    k.name,
                    many.len(),
                    many.iter().map(|&i| sigs[i].name).collect::<Vec<_>>()
                )),
            }
        }
    }
    for (s, u) in sigs.iter().zip(&used) {
        if !u {
            problems.push(format!(
                "launcher {} (kernels/{}.cu) matches no kernel of its source",
                s.name, s.source
            ));
        }
    }
    (kernels_seen, problems)
}

#[test]
fn every_kernel_has_one_launcher_with_its_parameters_in_order() {
    let (kernels_seen, problems) = check(&all_signatures());
    assert!(kernels_seen >= 50, "only {kernels_seen} kernels parsed");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A kernel without a launcher is caught, for a plain kernel, a macro-stamped family and a
/// kernel of each of the three launcher modules: the fused RMSNorm + FP8 quantization
/// (runtime.cu), the flash-decoding instances for BF16 KV (a `#define` stamps them out) and the
/// W4A16 wgmma pre-pass (w4a16_wg.cu).
#[test]
fn a_kernel_without_its_launcher_is_caught() {
    let dropped = [
        ("runtime", "rt_add_rmsnorm_quant"),
        ("runtime", "rt_attn_flash_bf16_hd*"),
        ("w4a16_wg", "w4wg_permute_act"),
        ("util", "l2_flush_read"),
    ];
    let sigs: Vec<KernelSig> = all_signatures()
        .into_iter()
        .filter(|s| !dropped.contains(&(s.source, s.name)))
        .collect();
    assert_eq!(sigs.len() + dropped.len(), all_signatures().len());
    let (_, problems) = check(&sigs);
    let missing = |kernel: &str| {
        problems
            .iter()
            .any(|p| p.contains(&format!("kernel {kernel} has no launcher")))
    };
    for k in [
        "rt_add_rmsnorm_quant",
        "rt_attn_flash_bf16_hd64",
        "rt_attn_flash_bf16_hd128",
        "rt_attn_flash_bf16_hd256",
        "w4wg_permute_act",
        "l2_flush_read",
    ] {
        assert!(missing(k), "{k} not reported: {problems:?}");
    }
    assert_eq!(problems.len(), 6, "{problems:?}");
}

/// The check fails when a declaration drifts from the source: the real `rt_embed` launcher
/// with its two `int` parameters swapped, and with one parameter dropped.
#[test]
fn a_drifted_declaration_of_a_real_kernel_is_caught() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/runtime.cu");
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} is not readable: {e}", path.display()));
    let kernels = parse_cuda_kernels(&src).expect("parses");
    let k = kernels
        .iter()
        .find(|k| k.name == "rt_embed")
        .expect("rt_embed in kernels/runtime.cu");
    let real = rigbench::runtime::backend::cuda::launchers::rt::SIGNATURES
        .iter()
        .find(|s| s.name == "rt_embed")
        .expect("rt_embed launcher");
    assert!(compare_with_source(real, k).is_empty());
    // ids, t, embed, h, x → ids, h, embed, t, x: both ints, same PTX, different meaning.
    let p = real.params;
    let swapped: &'static [_] = Box::leak(vec![p[0], p[3], p[2], p[1], p[4]].into_boxed_slice());
    let drifted = KernelSig {
        params: swapped,
        ..*real
    };
    assert_eq!(compare_with_source(&drifted, k).len(), 2);
    let short = KernelSig {
        params: &p[..4],
        ..*real
    };
    assert!(!compare_with_source(&short, k).is_empty());
}
