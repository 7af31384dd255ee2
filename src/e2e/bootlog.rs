//! Engine logs, read by `crate::diagnose` (the one parser and the one set of findings for
//! `diagnose`, `e2e --engine-log` and `report`). This module keeps the names e2e uses.
//!
//! KV capacity from a log, for the e2e driver: [`BootLog::kv_capacity`] (tokens and the boot
//! record) and [`BootLog::kv_reading`] / [`kv_capacity_from_log`] (tokens, the 1-based line and
//! how they were read). For llama.cpp the capacity is the `llama_kv_cache: size = … (C cells,
//! L layers, S/T seqs)` line's C × T (cells are per stream; T is 1 when `kv_unified`), else the
//! default-verbosity `load_model: initializing, n_slots = N, n_ctx_slot = C, kv_unified = …`
//! line's N × C (or C alone when unified), else `llama_context: n_ctx` when the oldest form
//! printed a KV cache; `docs/diagnose.md` lists every engine's lines. These signatures are
//! stable: the driver decides the precedence between this reading and an engine endpoint
//! (llama.cpp `/slots`, vLLM `/metrics`).

pub use crate::diagnose::log::{Boot, EngineLog as BootLog, ErrorGroup, KvReading, MarlinFallback};
pub use crate::diagnose::spec::{pool_spec, SpecLogGeneration, SpecLogLine, SpecPooled};

/// The KV capacity an engine log states (the last boot that states one): tokens, the line, and
/// the rule that read them (`2,048 cells × 4 streams (…)`, `n_slots 4 × n_ctx_slot 2,048`,
/// `as printed`). `None` when no line states it; never derived from GiB.
pub fn kv_capacity_from_log(text: &str) -> Option<KvReading> {
    BootLog::parse(text).kv_reading()
}

/// Lines an engine prints once it is up and serving: llama.cpp's `llama_server: listening on`
/// (older builds: `main: server is listening on`), vLLM's (uvicorn's) `Application startup
/// complete`, SGLang's `The server is fired up and ready to roll`.
pub const READY_LINES: [&str; 4] = [
    "llama_server: listening on",
    "server is listening on",
    "Application startup complete",
    "The server is fired up",
];

/// The boot of the last start in `text`: everything up to and including its last
/// [`READY_LINES`] line. `None` when no line says the engine is up (then what precedes the
/// session cannot be told apart from earlier traffic).
pub fn boot_part(text: &str) -> Option<&str> {
    let mut end = None;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        pos += line.len();
        if READY_LINES.iter().any(|m| line.contains(m)) {
            end = Some(pos);
        }
    }
    end.map(|e| &text[..e])
}

/// An engine log given with `--engine-log` for an engine rigbench did not start, which keeps
/// growing while rigbench runs: its boot, read when the session starts, and on each read the
/// part the engine wrote since then (from the byte offset the file had at the start to its end).
/// What the engine logged between its boot and the session (earlier traffic) is never reported
/// as this session's.
#[derive(Debug, Clone)]
pub struct EngineLogFile {
    /// The file.
    pub path: std::path::PathBuf,
    /// The boot part, or the whole file as it was at the start when no ready line was found.
    boot: String,
    /// Whether a ready line ended `boot` ([`boot_part`]).
    boot_found: bool,
    /// The file's length in bytes when the session started.
    start: u64,
    /// Lines between the boot and the session (earlier traffic, left out): [`Self::text_now`]
    /// keeps their place as empty lines, so that a line number in its text is the file's.
    gap_lines: usize,
}

impl EngineLogFile {
    /// Read `path` as the session starts.
    ///
    /// # Errors
    /// The file cannot be read (the error names it and the flag).
    pub fn open(path: &std::path::Path) -> Result<Self, crate::RigError> {
        let bytes = std::fs::read(path).map_err(|e| {
            crate::RigError::file(path, format!("cannot read engine log (--engine-log): {e}"))
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let (boot, boot_found) = match boot_part(&text) {
            Some(b) => (b.to_string(), true),
            None => (text.to_string(), false),
        };
        let gap_lines = text[boot.len()..].matches('\n').count();
        Ok(Self {
            path: path.to_path_buf(),
            boot,
            boot_found,
            start: bytes.len() as u64,
            gap_lines,
        })
    }

    /// The boot part (see [`EngineLogFile::open`]).
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// What the engine wrote since the session started, and how it was read. A file shorter
    /// than at the start (rotated, truncated) is read from its beginning, and said so; a file
    /// that cannot be read any more gives nothing, and says so.
    pub fn since_start(&self) -> (String, String) {
        let (run, how, _) = self.read_since_start();
        (run, how)
    }

    /// [`Self::since_start`], and whether the part read continues the file as it was at the
    /// start (not rotated, not unreadable).
    fn read_since_start(&self) -> (String, String, bool) {
        let name = self.path.display();
        match std::fs::read(&self.path) {
            Ok(b) if b.len() as u64 >= self.start => (
                String::from_utf8_lossy(&b[self.start as usize..]).into_owned(),
                format!(
                    "{name}: bytes {}–{} (written during this session){}",
                    self.start,
                    b.len(),
                    self.boot_note()
                ),
                true,
            ),
            Ok(b) => (
                String::from_utf8_lossy(&b).into_owned(),
                format!(
                    "{name}: shorter ({} bytes) than at the start ({} bytes), rotated or truncated: read whole{}",
                    b.len(),
                    self.start,
                    self.boot_note()
                ),
                false,
            ),
            Err(e) => (
                String::new(),
                format!("{name}: cannot be read again ({e}): only its boot was read"),
                false,
            ),
        }
    }

    fn boot_note(&self) -> &'static str {
        if self.boot_found {
            "; boot facts from its last start, up to the line saying the engine is up"
        } else {
            "; no line says the engine is up, so everything before the session was read as its boot (it may hold earlier traffic)"
        }
    }

    /// The boot and what was written since the session started, as one text to parse, with
    /// the earlier traffic between them blanked to empty lines: a finding's line number in it is
    /// the file's own (unless the file was rotated, which [`Self::since_start`] says).
    pub fn text_now(&self) -> String {
        let (run, _, continues) = self.read_since_start();
        let mut t = self.boot.clone();
        if continues {
            // Boot, blanked gap and run are the file line for line (a boot that ends mid-line
            // goes on in the run, as in the file).
            t.push_str(&"\n".repeat(self.gap_lines));
        } else if !t.is_empty() && !t.ends_with('\n') {
            t.push('\n');
        }
        t.push_str(&run);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_log_file_is_read_from_the_session_start_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.log");
        let boot = "0.00.526.077 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 2048, kv_unified = 'false'\n0.00.565.968 I srv  llama_server: listening on http://127.0.0.1:8080\n";
        std::fs::write(&p, format!("{boot}EARLIER TRAFFIC\nMORE OF IT\n")).unwrap();
        let f = EngineLogFile::open(&p).unwrap();
        assert_eq!(f.boot(), boot);
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(b"THIS RUN\n").unwrap();
        let (run, how) = f.since_start();
        assert_eq!(run, "THIS RUN\n");
        assert!(how.contains("written during this session"), "{how}");
        let now = f.text_now();
        assert!(
            now.contains("kv_unified") && now.contains("THIS RUN") && !now.contains("EARLIER"),
            "{now}"
        );
        // Line numbers are the file's: THIS RUN is the file's 5th line, and the 5th of the text.
        let file = std::fs::read_to_string(&p).unwrap();
        let at = |t: &str| t.lines().position(|l| l == "THIS RUN");
        assert_eq!(at(&now), at(&file));
        assert_eq!(at(&file), Some(4));
        // Truncated: read whole, said so.
        std::fs::write(&p, "NEW\n").unwrap();
        let (run, how) = f.since_start();
        assert_eq!(run, "NEW\n");
        assert!(how.contains("rotated or truncated"), "{how}");
        // No ready line: the whole prefix is the boot, said so.
        std::fs::write(&p, "no ready line\n").unwrap();
        let f = EngineLogFile::open(&p).unwrap();
        assert!(f.since_start().1.contains("may hold earlier traffic"));
        let missing = EngineLogFile::open(&dir.path().join("nope.log")).unwrap_err();
        assert!(missing.to_string().contains("--engine-log"), "{missing}");
    }

    #[test]
    fn llamacpp_capacity_for_the_driver() {
        let r = kv_capacity_from_log(
            "0.00.039.885 I llama_kv_cache: size =    4.00 MiB (  2048 cells,   2 layers,  4/4 seqs), K (f16):    2.00 MiB, V (f16):    2.00 MiB\n",
        )
        .unwrap();
        assert_eq!((r.tokens, r.line), (8_192, 1));
        let r = kv_capacity_from_log(
            "0.00.526.077 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'false'\n",
        )
        .unwrap();
        assert_eq!(r.tokens, 8_192);
        let r = kv_capacity_from_log(
            "0.00.526.077 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 4096, kv_unified = 'true'\n",
        )
        .unwrap();
        assert_eq!(r.tokens, 4_096);
        assert!(kv_capacity_from_log("nothing here\n").is_none());
    }
}
