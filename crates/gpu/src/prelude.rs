//! rigbench's CUDA headers (`kernels/common.cuh`, the BF16 / E4M3 prelude every
//! `kernels/*.cu` includes, and `kernels/qk_norm_rope_kv.cuh`, the attention prologue shared by
//! the dense and hybrid runtime kernels), embedded in the binary and handed to NVRTC through its
//! include path: [`include_dir`] writes them once into a folder named by their SHA-256 (so two
//! binaries with different headers never share one) and every NVRTC build adds that folder to
//! `--include-path`. [`sha256`] is part of the compiled-kernel cache key
//! ([`crate::kernel_cache::CacheKey`]), so editing a header recompiles every kernel.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::GpuError;

/// The headers: (file name as `#include`d, text).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    (
        "qk_norm_rope_kv.cuh",
        include_str!("../../../kernels/qk_norm_rope_kv.cuh"),
    ),
];

/// SHA-256 (hex) over every header's name and text, length-prefixed: one value that changes
/// when any header changes.
pub fn sha256() -> String {
    let mut bytes = Vec::new();
    for (name, text) in HEADERS {
        for part in [name.as_bytes(), text.as_bytes()] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part);
        }
    }
    crate::kernel_cache::sha256_hex(&bytes)
}

/// The folder holding [`HEADERS`], for NVRTC's include path: `rigbench-cuda-headers-<first 16
/// hex digits of [`sha256`]>` under the system's temporary folder, written on first use (each
/// file through a temporary file renamed into place, so concurrent processes never see half a
/// header) and kept for the process's lifetime.
///
/// # Errors
/// The folder or a file cannot be written (the message names the path and says to free or fix
/// the temporary folder, `TMPDIR`).
pub fn include_dir() -> Result<PathBuf, GpuError> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| write_headers(&std::env::temp_dir()))
        .clone()
        .map_err(GpuError::NoGpu)
}

/// Write [`HEADERS`] under `root` (see [`include_dir`]); the folder, or why not.
fn write_headers(root: &std::path::Path) -> Result<PathBuf, String> {
    let dir = root.join(format!("rigbench-cuda-headers-{}", &sha256()[..16]));
    let fail = |p: &std::path::Path, e: std::io::Error| {
        format!(
            "cannot write rigbench's CUDA headers to {} ({e}): free or fix the temporary folder (TMPDIR)",
            p.display()
        )
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(&dir, e))?;
    for (name, text) in HEADERS {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|t| t == *text) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| fail(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| fail(&path, e))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_written_once_and_rewritten_when_changed() {
        let root =
            std::env::temp_dir().join(format!("rigbench-prelude-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = write_headers(&root).unwrap();
        for (name, text) in HEADERS {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), *text);
        }
        // A damaged header is put back.
        std::fs::write(dir.join(HEADERS[0].0), "garbage").unwrap();
        assert_eq!(write_headers(&root).unwrap(), dir);
        assert_eq!(
            std::fs::read_to_string(dir.join(HEADERS[0].0)).unwrap(),
            HEADERS[0].1
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_digest_covers_every_header() {
        assert_eq!(sha256().len(), 64);
        assert!(HEADERS
            .iter()
            .any(|(n, t)| *n == "common.cuh" && t.contains("bf2f")));
        // Every kernels/*.cu source includes the prelude (util.cu's copy is embedded here).
        assert!(crate::util_kernels::SRC.contains("#include \"common.cuh\""));
    }
}
