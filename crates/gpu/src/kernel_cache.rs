//! The compiled-kernel cache: the PTX NVRTC made for one kernel source, kept in the user's cache
//! folder so that the next process on the machine loads it instead of compiling again (see
//! docs/architecture.md, "GPU layer").
//!
//! - Folder: `$RIGBENCH_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/rigbench/kernels`, else
//!   `$HOME/.cache/rigbench/kernels` (the same root `scripts/fetch-smollm2.sh` uses).
//!   `RIGBENCH_KERNEL_CACHE=off` turns the cache off.
//! - Key: SHA-256 of the source text, the NVRTC options (architecture and defines), the CUDA
//!   include folder and the NVRTC version ([`CacheKey`]). Any change of one of them is a miss.
//! - Entry: one file per key, its first line carrying the SHA-256 of the PTX that follows; an
//!   entry whose PTX does not match (a torn or edited file) is reported and rebuilt. Entries
//!   are written to a temporary file in the same folder and renamed into place (atomic on one
//!   file system), so a reader never sees half an entry.
//!
//! Host logic only: nothing here calls CUDA.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The first bytes of an entry, before the SHA-256 of its PTX.
const ENTRY_MAGIC: &str = "// rigbench compiled-kernel cache v1 ptx-sha256=";

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// What identifies one compiled kernel source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    /// The source's name (the stem of `kernels/NAME.cu`), for the file name and messages.
    pub name: String,
    /// SHA-256 of the source text (also what results record, see `source_hashes`).
    pub source_sha256: String,
    /// The target architecture (`sm_90`, `sm_90a`, …).
    pub arch: String,
    /// Extra NVRTC options (defines such as `-DW4_LOAD=1`), in the order given.
    pub options: Vec<String>,
    /// The CUDA include folder the source is compiled against.
    pub include: String,
    /// NVRTC's version (`major.minor`).
    pub nvrtc_version: String,
    /// SHA-256 of rigbench's own CUDA headers (`kernels/common.cuh` and the others every
    /// source may include, [`crate::prelude::sha256`]).
    pub headers_sha256: String,
}

impl CacheKey {
    /// The key of compiling `source` (named `name`) for `arch` with `options`, headers from
    /// `include`, by NVRTC `nvrtc_version`.
    pub fn new(
        name: &str,
        source: &str,
        arch: &str,
        options: &[String],
        include: &Path,
        nvrtc_version: &str,
    ) -> Self {
        Self {
            name: name.to_string(),
            source_sha256: sha256_hex(source.as_bytes()),
            arch: arch.to_string(),
            options: options.to_vec(),
            include: include.display().to_string(),
            nvrtc_version: nvrtc_version.to_string(),
            headers_sha256: crate::prelude::sha256(),
        }
    }

    /// SHA-256 over every part of the key (each part length-prefixed, so that no two different
    /// keys write the same bytes).
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        let mut part = |s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        };
        part("rigbench-kernel-cache-v1");
        part(&self.name);
        part(&self.source_sha256);
        part(&self.arch);
        part(&self.options.len().to_string());
        for o in &self.options {
            part(o);
        }
        part(&self.include);
        part(&self.nvrtc_version);
        part(&self.headers_sha256);
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The entry's file name: `NAME-ARCH-<first 32 hex digits of the digest>.ptx`.
    pub fn file_name(&self) -> String {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect()
        };
        format!(
            "{}-{}-{}.ptx",
            safe(&self.name),
            safe(&self.arch),
            &self.digest()[..32]
        )
    }
}

/// The cache folder from the environment (see the module docs), or `None` when it is turned
/// off or no folder is known.
pub fn cache_dir_from_env() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if env("RIGBENCH_KERNEL_CACHE").is_some_and(|v| v == "off" || v == "0") {
        return None;
    }
    env("RIGBENCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("rigbench")))
        .or_else(|| env("HOME").map(|p| PathBuf::from(p).join(".cache").join("rigbench")))
        .map(|root| root.join("kernels"))
}

/// What a look-up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A whole entry: its PTX.
    Hit(String),
    /// No entry for the key.
    Miss,
    /// An entry that is not whole or not ours (why); it is to be compiled and written again.
    Corrupt(String),
}

/// How a module's PTX was obtained (recorded with the module, said in notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// Loaded from the cache: NVRTC did not run.
    Hit,
    /// Compiled, then written to the cache.
    Miss,
    /// The entry was corrupt: compiled and written again.
    Rebuilt,
    /// No cache (turned off, no folder, or the PTX came from elsewhere).
    Off,
}

/// A cache folder.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// The cache in folder `dir` (created on the first store).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The cache the environment names (see [`cache_dir_from_env`]).
    pub fn from_env() -> Option<Self> {
        cache_dir_from_env().map(Self::at)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for `key`.
    pub fn lookup(&self, key: &CacheKey) -> Lookup {
        let path = self.dir.join(key.file_name());
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            // No entry, or no folder yet (a path component that is a file: the store says so).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Lookup::Miss
            }
            Err(e) => return Lookup::Corrupt(format!("{} is not readable: {e}", path.display())),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return Lookup::Corrupt(format!("{} is not UTF-8 text", path.display()));
        };
        let Some((head, ptx)) = text.split_once('\n') else {
            return Lookup::Corrupt(format!("{} has no header line", path.display()));
        };
        match head.strip_prefix(ENTRY_MAGIC) {
            Some(sum) if sum == sha256_hex(ptx.as_bytes()) => Lookup::Hit(ptx.to_string()),
            Some(_) => Lookup::Corrupt(format!(
                "{}: the PTX does not match its checksum (a torn or edited entry)",
                path.display()
            )),
            None => Lookup::Corrupt(format!("{} has no rigbench header", path.display())),
        }
    }

    /// Write the entry for `key` atomically (a temporary file in the folder, renamed).
    ///
    /// # Errors
    /// The folder cannot be created or written (the message names it).
    pub fn store(&self, key: &CacheKey, ptx: &str) -> Result<PathBuf, String> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let path = self.dir.join(key.file_name());
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.file_name(),
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let body = format!("{ENTRY_MAGIC}{}\n{ptx}", sha256_hex(ptx.as_bytes()));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(body.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })?;
        Ok(path)
    }
}

/// Get the PTX for `key`: from `cache` when it holds a whole entry, else from `compile`
/// (then stored). Returns the PTX, how it was obtained, and notes to show (a corrupt entry
/// rebuilt, a store that failed); a failing store never fails the compile.
///
/// # Errors
/// What `compile` returns.
pub fn get_or_compile<E>(
    cache: Option<&KernelCache>,
    key: &CacheKey,
    compile: impl FnOnce() -> Result<String, E>,
) -> Result<(String, CacheUse, Vec<String>), E> {
    let mut notes = Vec::new();
    let Some(cache) = cache else {
        return compile().map(|p| (p, CacheUse::Off, notes));
    };
    let how = match cache.lookup(key) {
        Lookup::Hit(ptx) => return Ok((ptx, CacheUse::Hit, notes)),
        Lookup::Miss => CacheUse::Miss,
        Lookup::Corrupt(why) => {
            notes.push(format!(
                "compiled-kernel cache: {why}; kernels/{}.cu compiled again and the entry rewritten",
                key.name
            ));
            CacheUse::Rebuilt
        }
    };
    let ptx = compile()?;
    if let Err(e) = cache.store(key, &ptx) {
        notes.push(format!(
            "compiled-kernel cache: {e} (the next run compiles again)"
        ));
    }
    Ok((ptx, how, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(source: &str, arch: &str, opts: &[&str], nvrtc: &str) -> CacheKey {
        let o: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
        CacheKey::new("w4a16", source, arch, &o, Path::new("/cuda/include"), nvrtc)
    }

    #[test]
    fn every_part_of_the_key_changes_it() {
        let base = key("src", "sm_90", &["-DA=1"], "13.0");
        let d = base.digest();
        assert_eq!(d, key("src", "sm_90", &["-DA=1"], "13.0").digest());
        assert_eq!(d.len(), 64);
        for other in [
            key("src ", "sm_90", &["-DA=1"], "13.0"),
            key("src", "sm_90a", &["-DA=1"], "13.0"),
            key("src", "sm_90", &["-DA=2"], "13.0"),
            key("src", "sm_90", &[], "13.0"),
            key("src", "sm_90", &["-DA=1"], "13.1"),
        ] {
            assert_ne!(other.digest(), d, "{other:?}");
        }
        let mut inc = base.clone();
        inc.include = "/other".into();
        assert_ne!(inc.digest(), d);
        // An edit of rigbench's CUDA headers (kernels/common.cuh) recompiles every kernel.
        assert_eq!(base.headers_sha256, crate::prelude::sha256());
        let mut hdr = base.clone();
        hdr.headers_sha256 = sha256_hex(b"another common.cuh");
        assert_ne!(hdr.digest(), d);
        // Parts are delimited: moving bytes between two options is a different key.
        assert_ne!(
            key("s", "sm_90", &["-DAB", "-DC"], "13.0").digest(),
            key("s", "sm_90", &["-DA", "B-DC"], "13.0").digest()
        );
        assert_eq!(base.source_sha256, sha256_hex(b"src"));
        assert!(base.file_name().starts_with("w4a16-sm_90-"));
    }

    #[test]
    fn sha256_matches_the_standard_vectors() {
        // FIPS 180-4 test vectors.
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_second_lookup_hits_and_compiles_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path().join("kernels"));
        let k = key("src", "sm_90", &[], "13.0");
        let mut compiles = 0;
        let (ptx, how, notes) = get_or_compile::<String>(Some(&cache), &k, || {
            compiles += 1;
            Ok(".version 9.0\n.entry k()\n{}\n".into())
        })
        .unwrap();
        assert_eq!((how, compiles), (CacheUse::Miss, 1));
        assert!(notes.is_empty());
        let (again, how, _) = get_or_compile::<String>(Some(&cache), &k, || {
            compiles += 1;
            Ok(String::new())
        })
        .unwrap();
        assert_eq!((how, compiles), (CacheUse::Hit, 1));
        assert_eq!(again, ptx);
        // Another key (other defines) misses.
        let k2 = key("src", "sm_90", &["-DX=1"], "13.0");
        assert_eq!(cache.lookup(&k2), Lookup::Miss);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(cache.dir()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_corrupt_entry_is_rebuilt_with_a_note() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let k = key("src", "sm_90", &[], "13.0");
        let path = cache.store(&k, ".entry good()\n").unwrap();
        // A torn write: the PTX cut short.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.len() - 4]).unwrap();
        assert!(matches!(cache.lookup(&k), Lookup::Corrupt(_)));
        let (ptx, how, notes) =
            get_or_compile::<String>(Some(&cache), &k, || Ok(".entry good()\n".into())).unwrap();
        assert_eq!(how, CacheUse::Rebuilt);
        assert_eq!(ptx, ".entry good()\n");
        assert!(notes[0].contains("compiled again"), "{notes:?}");
        assert_eq!(cache.lookup(&k), Lookup::Hit(".entry good()\n".into()));
        // Not ours at all.
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(cache.lookup(&k), Lookup::Corrupt(_)));
    }

    #[test]
    fn a_compile_error_is_returned_and_nothing_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::at(dir.path());
        let k = key("bad", "sm_90", &[], "13.0");
        let r = get_or_compile(Some(&cache), &k, || Err("syntax error"));
        assert_eq!(r.unwrap_err(), "syntax error");
        assert_eq!(cache.lookup(&k), Lookup::Miss);
        let (_, how, _) = get_or_compile::<String>(None, &k, || Ok("x".into())).unwrap();
        assert_eq!(how, CacheUse::Off);
    }

    #[test]
    fn an_unwritable_folder_is_a_note_not_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-folder");
        std::fs::write(&file, "x").unwrap();
        let cache = KernelCache::at(file.join("kernels"));
        let k = key("src", "sm_90", &[], "13.0");
        let (ptx, how, notes) =
            get_or_compile::<String>(Some(&cache), &k, || Ok("ptx".into())).unwrap();
        assert_eq!((ptx.as_str(), how), ("ptx", CacheUse::Miss));
        assert!(notes[0].contains("cannot create"), "{notes:?}");
    }
}
