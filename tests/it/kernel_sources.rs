//! Every CUDA source of the repository (`kernels/*.cu`: the kernel bench's and the runtime's)
//! against NVRTC, with the kernel names each side launches. It lives here, above both, because
//! it checks kernels/ (bench) and runtime/ (engine) sources alike.

/// One test per CUDA source (so the harness compiles them side by side on its threads: one
/// after another they took 98 s of a test run), and `SOURCES`, the list of them, which a test
/// checks is `kernels/*.cu`, so a new source cannot go unchecked. One list makes both.
macro_rules! source_tests {
    ($($test:ident => $stem:literal),* $(,)?) => {
        const SOURCES: &[&str] = &[$($stem),*];
        $(
            #[test]
            fn $test() {
                compiles_with_nvrtc($stem);
            }
        )*
    };
}

source_tests! {
    fp8_quant_compiles_with_nvrtc => "fp8_quant",
    gdn_compiles_with_nvrtc => "gdn",
    gemv_compiles_with_nvrtc => "gemv",
    moe_compiles_with_nvrtc => "moe",
    runtime_compiles_with_nvrtc => "runtime",
    util_compiles_with_nvrtc => "util",
    w4a16_compiles_with_nvrtc => "w4a16",
    w4a16_v2_compiles_with_nvrtc => "w4a16_v2",
    w4a16_wg_compiles_with_nvrtc => "w4a16_wg",
}

#[test]
fn the_sources_checked_are_every_kernels_cu() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut stems: Vec<String> = std::fs::read_dir(&dir)
        .expect("kernels/ is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    stems.sort();
    let mut listed = SOURCES.to_vec();
    listed.sort_unstable();
    assert_eq!(
        stems, listed,
        "add a source_tests! line per new kernels/*.cu"
    );
}

/// Compiles `kernels/{name}.cu` with NVRTC for sm_90 (no GPU needed) and checks the kernels
/// rigbench launches are in the PTX, with their launchers' parameter lists. Without libnvrtc or
/// the CUDA headers it says so plainly, and fails when `RIGBENCH_REQUIRE_NVRTC=1` (what
/// `.ci/run` sets when it has libnvrtc).
fn compiles_with_nvrtc(name: &str) {
    let require = std::env::var("RIGBENCH_REQUIRE_NVRTC").as_deref() == Ok("1");
    let missing = if !rigbench::gpu::libraries().nvrtc {
        Some("libnvrtc not found (install the CUDA 13 toolkit or add its lib folder to LD_LIBRARY_PATH)".to_string())
    } else if rigbench::gpu::probe::cuda_include_dir().is_none() {
        Some("CUDA headers not found (set CUDA_HOME)".to_string())
    } else {
        None
    };
    if let Some(why) = missing {
        assert!(!require, "RIGBENCH_REQUIRE_NVRTC=1 but {why}");
        eprintln!("NOT RUN: kernels/{name}.cu was NOT compiled: {why}");
        return;
    }
    let inc = rigbench::gpu::probe::cuda_include_dir().expect("checked above");
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("kernels")
        .join(format!("{name}.cu"));
    let sigs = [
        rigbench::gpu::util_kernels::SIGNATURES.to_vec(),
        rigbench::gemm::launchers::signatures(),
        rigbench::runtime::backend::cuda::launchers::signatures(),
    ]
    .concat();
    let src = std::fs::read_to_string(&f).expect("readable");
    // The flavour rigbench compiles by default (`W4A16_DEFAULT_FLAVOR`).
    let defines: Vec<String> = if name == "w4a16" {
        rigbench::gemm::W4A16_DEFAULT_FLAVOR
            .1
            .iter()
            .map(|d| d.to_string())
            .collect()
    } else {
        Vec::new()
    };
    // The wgmma kernel is sm_90a-only (architecture-specific instructions).
    let arch = if name == "w4a16_wg" {
        rigbench::gemm::w4a16_wg::WG_ARCH
    } else {
        "sm_90"
    };
    let (ptx, _) = rigbench::gpu::context::nvrtc_compile_with(name, &src, arch, &inc, &defines)
        .unwrap_or_else(|e| panic!("{} does not compile: {e}", f.display()));
    let text = ptx;
    let expected: Vec<String> = match name {
        "util" => rigbench::kernels::bench::UTIL_KERNELS
            .iter()
            .map(|k| k.to_string())
            .collect(),
        "w4a16" => rigbench::gemm::w4a16::kernel_names(),
        "w4a16_v2" => rigbench::gemm::w4a16::v2_kernel_names(),
        "fp8_quant" => rigbench::gemm::fp8_quant::kernel_names(),
        "gemv" => rigbench::gemm::gemv::kernel_names(),
        "moe" => rigbench::gemm::moe::kernel_names(),
        "w4a16_wg" => rigbench::gemm::w4a16_wg::kernel_names(),
        "runtime" => rigbench::runtime::backend::cuda::RUNTIME_KERNELS
            .iter()
            .map(|k| k.to_string())
            .collect(),
        _ => Vec::new(),
    };
    // Each name as a whole `.entry` (a name that is a prefix of another, such as a general
    // grouped kernel and its `_t8` form, must be there itself).
    let entries = rigbench::gpu::launch::parse_ptx_entries(&text);
    for k in expected {
        assert!(
            entries.iter().any(|(e, _)| *e == k),
            "{k} missing from the PTX of {}",
            f.display()
        );
    }
    if name == "w4a16" {
        assert!(text.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        assert!(text.contains("ld.global.nc.L1::no_allocate.v4.u32"));
    }
    if name == "w4a16_wg" {
        for tn in rigbench::gemm::w4a16_wg::TN_VARIANTS {
            let op = format!("wgmma.mma_async.sync.aligned.m64n{tn}k16.f32.bf16.bf16");
            assert!(text.contains(&op), "{op} missing from the PTX");
        }
        assert!(text.contains(".target sm_90a"));
        assert!(text.contains("fence.proxy.async.shared::cta"));
    }
    // The launchers' parameter lists against the PTX `.param` lists (docs/architecture.md,
    // "GPU layer"; the source-level half is tests/it/kernel_abi.rs).
    assert!(
        !entries.is_empty(),
        "no .entry in the PTX of {}",
        f.display()
    );
    for (entry, types) in &entries {
        let sig = sigs
            .iter()
            .find(|s| s.source == name && rigbench::gpu::launch::name_matches(s.name, entry))
            .unwrap_or_else(|| panic!("{entry} (kernels/{name}.cu) has no launcher"));
        let diffs = rigbench::gpu::launch::compare_with_ptx(sig, entry, types);
        assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    }
    eprintln!(
        "compiled {} for {arch}; {} entries match their launchers",
        f.display(),
        entries.len()
    );
}
