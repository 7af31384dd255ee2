//! Atomic file writes: write to a temporary file in the same folder, flush, then rename, so a
//! crash leaves either the old file or the new one, never half of one.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Write `bytes` to `path` atomically, creating parent folders.
///
/// # Errors
/// The folder cannot be created, or the temporary file cannot be written or renamed; the error
/// names the path.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create folder {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".rigbench-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    // Temporary files are created 0600; a report is meant to be read by others too.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = tmp
            .as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot move the new file into place at {}", path.display()))?;
    Ok(())
}

/// Serialize `value` as pretty JSON (with a trailing newline) and write it atomically.
pub fn atomic_write_json<T: serde::Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let mut s = serde_json::to_string_pretty(value).context("cannot serialize results to JSON")?;
    s.push('\n');
    atomic_write(path, s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/x.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn unwritable_folder_names_the_path() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let err = atomic_write(&file.join("under-a-file.json"), b"y").unwrap_err();
        assert!(
            format!("{err:#}").contains("under-a-file") || format!("{err:#}").contains("plain")
        );
    }
}
