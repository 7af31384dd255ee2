//! safetensors headers: name, dtype, shape and byte size of every tensor, reading only the
//! 8-byte length and the JSON header of each file (never the tensor data).
//!
//! Format (huggingface/safetensors): a little-endian u64 `N`, then `N` bytes of UTF-8 JSON
//! mapping tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (plus an optional
//! `__metadata__` map), then the data. The JSON is parsed and validated (contiguous offsets,
//! byte size = elements × dtype bits / 8) by the `safetensors` crate's `Metadata`; the header
//! length is capped at the crate's limit of 100,000,000 bytes. Sharded checkpoints list their
//! files in `model.safetensors.index.json` (`{"weight_map": {tensor: file}}`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{json_kind, read_json_object};
use crate::RigError;

/// Largest header accepted, bytes (the `safetensors` crate's `MAX_HEADER_SIZE`).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The dtype of a tensor known only by name (from `model.safetensors.index.json`, its shard not
/// downloaded).
pub const UNKNOWN_DTYPE: &str = "unknown";

/// One tensor as its header describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMeta {
    /// Full tensor name.
    pub name: String,
    /// safetensors dtype name (`BF16`, `F8_E4M3`, `U8`, `F32`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Bytes of data.
    pub bytes: u64,
    /// The file it lives in (name inside the checkpoint folder).
    pub file: String,
}

/// One safetensors file's header facts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name inside the checkpoint folder.
    pub file: String,
    /// File size, bytes.
    pub file_bytes: u64,
    /// JSON header length, bytes.
    pub header_bytes: u64,
    /// Tensor data the header describes, bytes.
    pub data_bytes: u64,
    /// Tensors in this file.
    pub tensors: usize,
}

/// All headers of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers {
    /// Every tensor, sorted by name.
    pub tensors: Vec<TensorMeta>,
    /// Per-file facts.
    pub shards: Vec<ShardInfo>,
    /// Files shorter or longer than header + data (truncated or padded downloads).
    pub size_mismatches: Vec<String>,
    /// Index/shard disagreements (tensor in the index but not in its shard, or the reverse).
    pub index_mismatches: Vec<String>,
    /// True when the list of files came from `model.safetensors.index.json`.
    pub from_index: bool,
    /// True when no shard named by the index is present: tensors are known by name only
    /// (dtype [`UNKNOWN_DTYPE`], no shape, 0 bytes). Inspecting configs and the index before
    /// downloading the weights is a normal use.
    pub names_only: bool,
    /// The index's `metadata.total_size`, bytes, when given.
    pub index_total_size: Option<u64>,
}

/// Read the header of one safetensors file.
///
/// # Errors
/// Unreadable file; fewer than 8 bytes; header length above [`MAX_HEADER_BYTES`] or larger
/// than the file; a truncated header; non-UTF-8 or invalid JSON; offsets or sizes the
/// `safetensors` crate rejects. Every error names the file.
pub fn read_header(
    path: &Path,
    display_name: &str,
) -> Result<(Vec<TensorMeta>, ShardInfo), RigError> {
    let mut f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            RigError::file(path, "not found")
        } else {
            RigError::file(path, format!("cannot open: {e}"))
        }
    })?;
    let file_bytes = f
        .metadata()
        .map_err(|e| RigError::file(path, format!("cannot stat: {e}")))?
        .len();
    if file_bytes < 8 {
        return Err(RigError::file(
            path,
            format!("truncated safetensors file: {file_bytes} bytes, fewer than the 8-byte header length"),
        ));
    }
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| RigError::file(path, format!("cannot read the header length: {e}")))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(RigError::file(
            path,
            format!(
                "safetensors header length {n} bytes is absurdly large (limit {MAX_HEADER_BYTES}); the file is corrupt or not safetensors"
            ),
        ));
    }
    if n + 8 > file_bytes {
        return Err(RigError::file(
            path,
            format!(
                "safetensors header length {n} bytes is larger than the file ({file_bytes} bytes): truncated download or not a safetensors file"
            ),
        ));
    }
    if n < 2 {
        return Err(RigError::file(
            path,
            format!("safetensors header length {n} bytes is too short for a JSON object"),
        ));
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf)
        .map_err(|e| RigError::file(path, format!("truncated safetensors header: {e}")))?;
    let text = std::str::from_utf8(&buf).map_err(|e| {
        RigError::file(
            path,
            format!(
                "safetensors header is not UTF-8 (invalid byte at header offset {})",
                e.valid_up_to()
            ),
        )
    })?;
    // Headers may be padded with trailing spaces (the format allows it).
    let md: safetensors::tensor::Metadata = serde_json::from_str(text.trim_end())
        .map_err(|e| RigError::file(path, format!("invalid safetensors header: {e}")))?;
    let mut tensors = Vec::new();
    let mut data_bytes = 0u64;
    for (name, info) in md.tensors() {
        let bytes = (info.data_offsets.1 - info.data_offsets.0) as u64;
        data_bytes = data_bytes.max(info.data_offsets.1 as u64);
        tensors.push(TensorMeta {
            name,
            dtype: info.dtype.to_string(),
            shape: info.shape.iter().map(|d| *d as u64).collect(),
            bytes,
            file: display_name.to_string(),
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let info = ShardInfo {
        file: display_name.to_string(),
        file_bytes,
        header_bytes: n,
        data_bytes,
        tensors: tensors.len(),
    };
    Ok((tensors, info))
}

/// A shard name from the index must stay inside the checkpoint folder.
fn safe_relative(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Read every safetensors header of the checkpoint in `dir`: the files named by
/// `model.safetensors.index.json` when it exists, else every `*.safetensors` file.
/// `Ok(None)` when there are none.
///
/// # Errors
/// A malformed index (not JSON, no `weight_map`, a shard path outside the folder), an index
/// naming a missing shard, or any [`read_header`] error; each names the file.
pub fn read_checkpoint(dir: &Path) -> Result<Option<Headers>, RigError> {
    let index_path = dir.join("model.safetensors.index.json");
    let mut out = Headers::default();
    // (name shown in reports, path opened): a file name that is not UTF-8 is shown lossily but
    // opened by its OS path, so it is read, not reported missing.
    let (files, weight_map): (Vec<(String, PathBuf)>, BTreeMap<String, String>) = if index_path
        .exists()
    {
        out.from_index = true;
        let (weight_map, set, total_size) = parse_index(&index_path)?;
        out.index_total_size = total_size;
        let missing: Vec<&String> = set.iter().filter(|f| !dir.join(f).is_file()).collect();
        if !set.is_empty() && missing.len() == set.len() {
            fill_names_only(&mut out, &set, &weight_map);
            return Ok(Some(out));
        }
        if let Some(f) = missing.first() {
            return Err(RigError::file(
                    &index_path,
                    format!(
                        "names shard '{f}', which is missing from {} while {} other shard(s) are present (incomplete download?); with no shard at all, rigbench reads the index alone",
                        dir.display(),
                        set.len() - missing.len()
                    ),
                ));
        }
        let files = set.into_iter().map(|f| (f.clone(), dir.join(f))).collect();
        (files, weight_map)
    } else {
        (list_safetensors(dir)?, BTreeMap::new())
    };
    if files.is_empty() {
        return Ok(None);
    }
    let present = read_shards(&files, &mut out)?;
    if out.from_index {
        check_index_against_shards(&weight_map, &present, &mut out);
    }
    out.tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(out))
}

/// The index's tensor -> shard map, its set of shard files, and its `metadata.total_size`.
type IndexContents = (BTreeMap<String, String>, BTreeSet<String>, Option<u64>);

/// Parse `model.safetensors.index.json`: its `weight_map` (every shard name checked to be a
/// file inside the checkpoint folder), the set of shards it names, and `metadata.total_size`.
fn parse_index(index_path: &Path) -> Result<IndexContents, RigError> {
    let idx = read_json_object(index_path)?;
    let wm = match idx.get("weight_map") {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(RigError::file(
                index_path,
                format!(
                    "field weight_map: expected an object, found {}",
                    json_kind(other)
                ),
            ))
        }
        None => {
            return Err(RigError::file(
                index_path,
                "no 'weight_map' object (expected {\"weight_map\": {tensor name: shard file}})",
            ))
        }
    };
    let total_size = idx
        .get("metadata")
        .and_then(|m| m.get("total_size"))
        .and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        });
    let mut set = BTreeSet::new();
    let mut weight_map = BTreeMap::new();
    for (t, f) in wm {
        let f = f.as_str().ok_or_else(|| {
            RigError::file(
                index_path,
                format!(
                    "field weight_map['{t}']: expected a file name, found {}",
                    json_kind(f)
                ),
            )
        })?;
        if !safe_relative(f) {
            return Err(RigError::file(
                index_path,
                format!("weight_map['{t}'] names '{f}', which is not a file inside the checkpoint folder"),
            ));
        }
        set.insert(f.to_string());
        weight_map.insert(t.clone(), f.to_string());
    }
    Ok((weight_map, set, total_size))
}

/// Configs + index, no shard: record the tensor names without dtypes or shapes, and each
/// shard's tensor count from the index.
fn fill_names_only(
    out: &mut Headers,
    set: &BTreeSet<String>,
    weight_map: &BTreeMap<String, String>,
) {
    out.names_only = true;
    out.shards = set
        .iter()
        .map(|f| ShardInfo {
            file: f.clone(),
            file_bytes: 0,
            header_bytes: 0,
            data_bytes: 0,
            tensors: weight_map.values().filter(|v| *v == f).count(),
        })
        .collect();
    out.tensors = weight_map
        .iter()
        .map(|(t, f)| TensorMeta {
            name: t.clone(),
            dtype: UNKNOWN_DTYPE.into(),
            shape: Vec::new(),
            bytes: 0,
            file: f.clone(),
        })
        .collect();
}

/// Every `*.safetensors` file in `dir` (no index), sorted by name.
fn list_safetensors(dir: &Path) -> Result<Vec<(String, PathBuf)>, RigError> {
    let mut files = Vec::new();
    let rd = std::fs::read_dir(dir)
        .map_err(|e| RigError::file(dir, format!("cannot list folder: {e}")))?;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && entry.path().is_file() {
            files.push((name, entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// Read the header of every file into `out` (tensors and shard facts), noting files whose size
/// disagrees with header + data and tensors found in two files. Returns tensor -> file.
fn read_shards(
    files: &[(String, PathBuf)],
    out: &mut Headers,
) -> Result<BTreeMap<String, String>, RigError> {
    let mut present: BTreeMap<String, String> = BTreeMap::new();
    for (f, path) in files {
        let (tensors, info) = read_header(path, f)?;
        let expected = 8 + info.header_bytes + info.data_bytes;
        if expected != info.file_bytes {
            out.size_mismatches.push(format!(
                "{f}: file is {} bytes, header + data need {expected}{}",
                info.file_bytes,
                if info.file_bytes < expected {
                    " (truncated)"
                } else {
                    " (trailing bytes)"
                }
            ));
        }
        for t in &tensors {
            if let Some(prev) = present.insert(t.name.clone(), f.clone()) {
                out.index_mismatches
                    .push(format!("tensor {} appears in both {prev} and {f}", t.name));
            }
        }
        out.tensors.extend(tensors);
        out.shards.push(info);
    }
    Ok(present)
}

/// Compare the index's `weight_map` with the tensors the shards hold: tensors the index places
/// in a shard that lacks them, and tensors in the shards the index does not name.
fn check_index_against_shards(
    weight_map: &BTreeMap<String, String>,
    present: &BTreeMap<String, String>,
    out: &mut Headers,
) {
    let mut missing = 0usize;
    let mut example = None;
    for (t, f) in weight_map {
        if present.get(t) != Some(f) {
            missing += 1;
            example.get_or_insert_with(|| format!("{t} (index says {f})"));
        }
    }
    if missing > 0 {
        out.index_mismatches.push(format!(
            "{} named by model.safetensors.index.json {} not in the shard it names, e.g. {}",
            crate::output::table::plural(missing as u64, "tensor", "tensors"),
            if missing == 1 { "is" } else { "are" },
            example.unwrap_or_default()
        ));
    }
    let extra = present
        .keys()
        .filter(|t| !weight_map.contains_key(*t))
        .count();
    if extra > 0 {
        out.index_mismatches.push(format!(
            "{} in the shards {} missing from model.safetensors.index.json's weight_map",
            crate::output::table::plural(extra as u64, "tensor", "tensors"),
            if extra == 1 { "is" } else { "are" }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn file_with_header(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    }

    #[test]
    fn reads_a_valid_header() {
        let d = tempfile::tempdir().unwrap();
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]},"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[16,20]}}"#;
        let p = write(d.path(), "m.safetensors", &file_with_header(h, 20));
        let (t, info) = read_header(&p, "m.safetensors").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "a");
        assert_eq!(t[0].dtype, "F8_E4M3");
        assert_eq!(t[1].shape, vec![2, 4]);
        assert_eq!(t[1].bytes, 16);
        assert_eq!(info.data_bytes, 20);
    }

    #[test]
    fn malformed_headers_name_the_file() {
        let d = tempfile::tempdir().unwrap();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("short.safetensors", vec![1, 2, 3], "fewer than the 8-byte"),
            (
                "huge.safetensors",
                {
                    let mut v = u64::MAX.to_le_bytes().to_vec();
                    v.extend_from_slice(b"{}");
                    v
                },
                "absurdly large",
            ),
            (
                "long.safetensors",
                {
                    let mut v = 1000u64.to_le_bytes().to_vec();
                    v.extend_from_slice(b"{}");
                    v
                },
                "larger than the file",
            ),
            (
                "utf8.safetensors",
                {
                    let mut v = 4u64.to_le_bytes().to_vec();
                    v.extend_from_slice(&[b'{', 0xff, 0xfe, b'}']);
                    v
                },
                "not UTF-8",
            ),
            (
                "json.safetensors",
                file_with_header("{\"a\":", 0),
                "invalid safetensors header",
            ),
            (
                "offsets.safetensors",
                file_with_header(
                    r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,3]}}"#,
                    3,
                ),
                "invalid safetensors header",
            ),
        ];
        for (name, bytes, want) in cases {
            let p = write(d.path(), name, &bytes);
            let e = read_header(&p, name).unwrap_err().to_string();
            assert!(e.contains(name), "{name}: {e}");
            assert!(e.contains(want), "{name}: {e}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let d = tempfile::tempdir().unwrap();
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..300 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && len >= 8 {
                // A plausible length prefix over random JSON-ish text.
                let n = (len - 8) as u64;
                bytes[..8].copy_from_slice(&n.to_le_bytes());
                let alphabet: &[u8] = b"{}[]\":,0123456789abcdtype shape data_offsets";
                for b in bytes[8..].iter_mut() {
                    *b = alphabet[(*b as usize) % alphabet.len()];
                }
            }
            let p = write(d.path(), "g.safetensors", &bytes);
            let _ = read_header(&p, "g.safetensors");
        }
    }

    #[test]
    fn index_naming_a_missing_shard() {
        let d = tempfile::tempdir().unwrap();
        // No shard at all: names only (inspecting before downloading).
        write(
            d.path(),
            "model.safetensors.index.json",
            br#"{"metadata":{"total_size":"64"},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#,
        );
        let h = read_checkpoint(d.path()).unwrap().unwrap();
        assert!(h.names_only);
        assert_eq!(h.index_total_size, Some(64));
        assert_eq!(h.tensors.len(), 2);
        assert!(h
            .tensors
            .iter()
            .all(|t| t.dtype == UNKNOWN_DTYPE && t.bytes == 0));
        // One of two present: an incomplete download, named.
        let h = r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        write(
            d.path(),
            "model-00001-of-00002.safetensors",
            &file_with_header(h, 4),
        );
        let e = read_checkpoint(d.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors.index.json"), "{e}");
        assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
        assert!(e.contains("incomplete download"), "{e}");
        write(
            d.path(),
            "model.safetensors.index.json",
            br#"{"weight_map":{"a":"../etc/passwd"}}"#,
        );
        let e = read_checkpoint(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a file inside"), "{e}");
    }

    #[test]
    fn truncated_data_is_reported_not_fatal() {
        let d = tempfile::tempdir().unwrap();
        let h = r#"{"a":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}}"#;
        write(d.path(), "model.safetensors", &file_with_header(h, 10));
        let hd = read_checkpoint(d.path()).unwrap().unwrap();
        assert_eq!(hd.size_mismatches.len(), 1);
        assert!(hd.size_mismatches[0].contains("truncated"));
    }

    #[test]
    fn no_files_is_none() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_checkpoint(d.path()).unwrap().is_none());
    }
}
