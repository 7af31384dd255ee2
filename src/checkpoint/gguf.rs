//! GGUF files (llama.cpp's single-file checkpoints): the header, the metadata key/value pairs
//! and the tensor table, parsed from a memory mapping without touching the tensor data.
//!
//! Layout (GGUF v2 and v3, `ggml/docs/gguf.md` and `gguf-py/gguf/gguf_reader.py` in llama.cpp;
//! all integers little-endian):
//!
//! ```text
//! u32 magic "GGUF" · u32 version · u64 tensor_count · u64 metadata_kv_count
//! metadata_kv_count × { string key · u32 value_type · value }
//! tensor_count × { string name · u32 n_dims · n_dims × u64 ne · u32 ggml_type · u64 offset }
//! padding to `general.alignment` (default 32) · tensor data
//! string = u64 length · UTF-8 bytes; array = u32 element type · u64 count · elements
//! ```
//!
//! `ne[0]` is the innermost (contiguous) dimension: a PyTorch weight `[N, K]` is stored with
//! `ne = [K, N]`. Tensor offsets are relative to the start of the data section, which begins at
//! the first multiple of the alignment after the tensor table. Version 1 (u32 counts and string
//! lengths, 2023) and big-endian files are refused with that reason.
//!
//! Robustness: every count is checked against the bytes left before anything is allocated
//! (each element takes at least one byte on disk), arrays nest at most [`MAX_ARRAY_DEPTH`]
//! deep, a tensor has at most 4 dimensions (`GGML_MAX_DIMS`), and every tensor's byte range
//! must lie inside the file. Errors name the byte offset; [`Gguf::open`] adds the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::formats::ggml::GgmlType;
use crate::RigError;

/// `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;

/// Default alignment of the data section and of tensor offsets (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Deepest nesting of arrays accepted (the files llama.cpp writes nest at most one deep).
pub const MAX_ARRAY_DEPTH: usize = 3;

/// Most dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// A parse failure: what was wrong and at which byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte offset {offset}: {message}")]
pub struct GgufError {
    /// Byte offset in the file where the bad field starts.
    pub offset: u64,
    /// What was wrong.
    pub message: String,
}

/// A metadata array, stored compactly per element type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "values", rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Array(Vec<Array>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF element type name (`uint8`, `string`, ...).
    pub fn element_type(&self) -> &'static str {
        match self {
            Array::U8(_) => "uint8",
            Array::I8(_) => "int8",
            Array::U16(_) => "uint16",
            Array::I16(_) => "int16",
            Array::U32(_) => "uint32",
            Array::I32(_) => "int32",
            Array::F32(_) => "float32",
            Array::Bool(_) => "bool",
            Array::Str(_) => "string",
            Array::U64(_) => "uint64",
            Array::I64(_) => "int64",
            Array::F64(_) => "float64",
            Array::Array(_) => "array",
        }
    }

    /// Integer elements as i64 (any integer element type; u64 above i64::MAX is refused).
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|x| *x as i64).collect(),
            Array::I8(v) => v.iter().map(|x| *x as i64).collect(),
            Array::U16(v) => v.iter().map(|x| *x as i64).collect(),
            Array::I16(v) => v.iter().map(|x| *x as i64).collect(),
            Array::U32(v) => v.iter().map(|x| *x as i64).collect(),
            Array::I32(v) => v.iter().map(|x| *x as i64).collect(),
            Array::U64(v) => v
                .iter()
                .map(|x| i64::try_from(*x).ok())
                .collect::<Option<_>>()?,
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }

    /// Float elements as f32 (F32 or F64 arrays).
    pub fn as_f32s(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|x| *x as f32).collect()),
            _ => None,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer value as u64 (any integer type; negative values are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number as f64 (floats and integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v as f64),
            Value::I16(v) => Some(v as f64),
            Value::I32(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF type name (`uint32`, `string`, `array[string]`, ...).
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "uint8".into(),
            Value::I8(_) => "int8".into(),
            Value::U16(_) => "uint16".into(),
            Value::I16(_) => "int16".into(),
            Value::U32(_) => "uint32".into(),
            Value::I32(_) => "int32".into(),
            Value::F32(_) => "float32".into(),
            Value::Bool(_) => "bool".into(),
            Value::Str(_) => "string".into(),
            Value::Array(a) => format!("array[{}]", a.element_type()),
            Value::U64(_) => "uint64".into(),
            Value::I64(_) => "int64".into(),
            Value::F64(_) => "float64".into(),
        }
    }

    /// Short display: scalars as they are, strings up to `max` characters (with the length
    /// when cut), arrays as `[N × type]` with their first elements when short.
    pub fn display(&self, max: usize) -> String {
        let cut = |s: &str| {
            let n = s.chars().count();
            if n <= max {
                s.replace('\n', "\\n")
            } else {
                format!(
                    "{}… ({n} characters)",
                    s.chars().take(max).collect::<String>().replace('\n', "\\n")
                )
            }
        };
        match self {
            Value::Str(s) => cut(s),
            Value::Array(a) => format!("[{} × {}]", a.len(), a.element_type()),
            Value::Bool(b) => b.to_string(),
            Value::F32(v) => format!("{v}"),
            Value::F64(v) => format!("{v}"),
            other => other
                .as_f64()
                .map(|v| format!("{v}"))
                .unwrap_or_else(|| "?".into()),
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorInfo {
    /// Name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// Dimensions, innermost first (`ne[0]` is contiguous).
    pub ne: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section, bytes.
    pub offset: u64,
    /// Elements (product of `ne`).
    pub elements: u64,
    /// Bytes of the data.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape in PyTorch order (outermost first): `[N, K]` for a weight.
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }
}

/// A parsed GGUF header: metadata and tensor table (no tensor data).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor table, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute byte offset where the data section starts (= bytes of header, metadata, tensor
    /// table and padding).
    pub data_start: u64,
    /// Size of the whole file, bytes.
    pub file_bytes: u64,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, at: usize, m: impl Into<String>) -> GgufError {
        GgufError {
            offset: at as u64,
            message: m.into(),
        }
    }

    fn left(&self) -> usize {
        self.b.len() - self.at
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(self.err(
                self.at,
                format!(
                    "{what}: needs {n} bytes, {} left (truncated file?)",
                    self.left()
                ),
            ));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.at;
        let n = self.u64(what)?;
        if n > self.left() as u64 {
            return Err(self.err(
                at,
                format!(
                    "{what}: string length {n} exceeds the {} bytes left",
                    self.left()
                ),
            ));
        }
        let s = self.take(n as usize, what)?;
        Ok(String::from_utf8_lossy(s).into_owned())
    }

    /// Check that `count` elements of at least `min` bytes each fit in what is left.
    fn fits(&self, at: usize, count: u64, min: u64, what: &str) -> Result<usize, GgufError> {
        match count.checked_mul(min) {
            Some(need) if need <= self.left() as u64 => Ok(count as usize),
            _ => Err(self.err(
                at,
                format!(
                    "{what}: {count} elements of at least {min} bytes do not fit in the {} bytes left",
                    self.left()
                ),
            )),
        }
    }

    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<Value, GgufError> {
        let at = self.at;
        Ok(match ty {
            0 => Value::U8(self.u8(what)?),
            1 => Value::I8(self.u8(what)? as i8),
            2 => Value::U16(self.u16(what)?),
            3 => Value::I16(self.u16(what)? as i16),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(self.u32(what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(at, format!("{what}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::Str(self.string(what)?),
            9 => Value::Array(self.array(what, depth + 1)?),
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            t => {
                return Err(self.err(
                    at,
                    format!("{what}: unknown value type {t} (GGUF defines 0-12)"),
                ))
            }
        })
    }

    fn array(&mut self, what: &str, depth: usize) -> Result<Array, GgufError> {
        let at = self.at;
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(
                at,
                format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            ));
        }
        let ty = self.u32(what)?;
        let count = self.u64(what)?;
        let min: u64 = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            t => {
                return Err(self.err(
                    at,
                    format!("{what}: unknown array element type {t} (GGUF defines 0-12)"),
                ))
            }
        };
        let n = self.fits(at, count, min, what)?;
        macro_rules! fixed {
            ($variant:ident, $size:expr, $conv:expr) => {{
                let raw = self.take(n * $size, what)?;
                Array::$variant(raw.chunks_exact($size).map($conv).collect())
            }};
        }
        Ok(match ty {
            0 => Array::U8(self.take(n, what)?.to_vec()),
            1 => Array::I8(self.take(n, what)?.iter().map(|b| *b as i8).collect()),
            2 => fixed!(U16, 2, |c: &[u8]| u16::from_le_bytes([c[0], c[1]])),
            3 => fixed!(I16, 2, |c: &[u8]| i16::from_le_bytes([c[0], c[1]])),
            4 => fixed!(U32, 4, |c: &[u8]| u32::from_le_bytes([
                c[0], c[1], c[2], c[3]
            ])),
            5 => fixed!(I32, 4, |c: &[u8]| i32::from_le_bytes([
                c[0], c[1], c[2], c[3]
            ])),
            6 => fixed!(F32, 4, |c: &[u8]| f32::from_le_bytes([
                c[0], c[1], c[2], c[3]
            ])),
            7 => {
                let raw = self.take(n, what)?;
                if let Some(i) = raw.iter().position(|b| *b > 1) {
                    return Err(self.err(
                        self.at - n + i,
                        format!("{what}: bool byte {} is neither 0 nor 1", raw[i]),
                    ));
                }
                Array::Bool(raw.iter().map(|b| *b == 1).collect())
            }
            8 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(what)?);
                }
                Array::Str(v)
            }
            9 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(what, depth + 1)?);
                }
                Array::Array(v)
            }
            10 => fixed!(U64, 8, |c: &[u8]| u64::from_le_bytes(
                c.try_into().unwrap_or([0; 8])
            )),
            11 => fixed!(I64, 8, |c: &[u8]| i64::from_le_bytes(
                c.try_into().unwrap_or([0; 8])
            )),
            _ => fixed!(F64, 8, |c: &[u8]| f64::from_le_bytes(
                c.try_into().unwrap_or([0; 8])
            )),
        })
    }
}

/// Parse the header, metadata and tensor table of a GGUF file held in `bytes` (the whole file,
/// usually a memory mapping: only the header pages are touched).
///
/// # Errors
/// A [`GgufError`] with the byte offset: bad magic, an unsupported version, a truncated or
/// inconsistent field, an unknown value or tensor type, a tensor whose data lies outside the
/// file or is misaligned, a duplicate key or tensor name.
pub fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    let mut r = Reader { b: bytes, at: 0 };
    let magic = r.u32("magic")?;
    if magic != GGUF_MAGIC {
        return Err(r.err(
            0,
            format!(
                "not a GGUF file: the first 4 bytes are {:?}, not \"GGUF\"",
                String::from_utf8_lossy(&bytes[..4])
            ),
        ));
    }
    let version = r.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(r.err(4, "GGUF version 1 (2023, 32-bit counts) is not supported; convert the model again with a current llama.cpp (convert_hf_to_gguf.py)")),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(r.err(4, format!("a big-endian GGUF (version {} byte-swapped): rigbench reads little-endian files only", v.swap_bytes())))
        }
        v => return Err(r.err(4, format!("GGUF version {v} is unknown (rigbench reads versions 2 and 3)"))),
    }
    let t_at = r.at;
    let tensor_count = r.u64("tensor_count")?;
    let kv_at = r.at;
    let kv_count = r.u64("metadata_kv_count")?;
    // Each KV takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least
    // 8 + 4 + 4 + 8.
    let kv_n = r.fits(kv_at, kv_count, 13, "metadata_kv_count")?;
    let mut metadata = BTreeMap::new();
    for i in 0..kv_n {
        let at = r.at;
        let key = r.string(&format!("metadata key {i}"))?;
        let ty = r.u32(&format!("type of metadata '{key}'"))?;
        let v = r.value(ty, &format!("metadata '{key}'"), 0)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(r.err(at, format!("metadata key '{key}' appears twice")));
        }
    }
    let tn = r.fits(t_at, tensor_count, 24, "tensor_count")?;
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(r.err(
                    0,
                    format!(
                        "general.alignment = {} is not a power of two up to 1 MiB",
                        v.display(40)
                    ),
                ))
            }
        },
    };
    let mut tensors = Vec::with_capacity(tn);
    let mut names = std::collections::HashSet::new();
    for i in 0..tn {
        let at = r.at;
        let name = r.string(&format!("tensor {i} name"))?;
        let what = format!("tensor '{name}'");
        let nd_at = r.at;
        let n_dims = r.u32(&what)? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.err(
                nd_at,
                format!("{what}: {n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            ne.push(r.u64(&what)?);
        }
        let ty_at = r.at;
        let ty = r.u32(&what)?;
        let ggml_type = GgmlType::from_id(ty).ok_or_else(|| {
            r.err(
                ty_at,
                format!("{what}: ggml type id {ty} is unknown to rigbench (or removed from ggml)"),
            )
        })?;
        let off_at = r.at;
        let offset = r.u64(&what)?;
        let elements = ne
            .iter()
            .try_fold(1u64, |a, d| a.checked_mul(*d))
            .ok_or_else(|| r.err(nd_at, format!("{what}: element count overflows: {ne:?}")))?;
        let (blk, _) = ggml_type.block();
        if ne[0] % blk as u64 != 0 {
            return Err(r.err(
                nd_at,
                format!(
                    "{what}: innermost dimension {} is not a multiple of {ggml_type}'s block of {blk}",
                    ne[0]
                ),
            ));
        }
        let bytes = ggml_type
            .bytes_for(elements)
            .ok_or_else(|| r.err(nd_at, format!("{what}: byte size overflows")))?;
        if offset % alignment != 0 {
            return Err(r.err(
                off_at,
                format!(
                    "{what}: data offset {offset} is not a multiple of the alignment {alignment}"
                ),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(r.err(at, format!("tensor name '{name}' appears twice")));
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            elements,
            bytes,
        });
    }
    let data_start = (r.at as u64).div_ceil(alignment) * alignment;
    let file_bytes = bytes.len() as u64;
    for t in &tensors {
        let end = data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.bytes));
        match end {
            Some(e) if e <= file_bytes => {}
            _ => {
                return Err(GgufError {
                    offset: data_start.saturating_add(t.offset),
                    message: format!(
                        "tensor '{}' ({} {:?}, {} bytes at data offset {}) ends past the end of the file ({file_bytes} bytes; truncated download?)",
                        t.name, t.ggml_type, t.ne, t.bytes, t.offset
                    ),
                })
            }
        }
    }
    Ok(GgufHeader {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
        file_bytes,
    })
}

/// A GGUF file opened by memory-mapping it: header parsed, tensor data borrowed on demand.
pub struct Gguf {
    /// The file.
    pub path: PathBuf,
    /// Header, metadata, tensor table.
    pub header: GgufHeader,
    map: memmap2::Mmap,
    index: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

/// The one `.gguf` file a path means: the file itself, or the only `*.gguf` in a folder.
///
/// # Errors
/// [`RigError::BadFile`]: no such path, a folder without or with several `.gguf` files (named).
pub fn resolve_path(path: &Path) -> Result<PathBuf, RigError> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(RigError::file(path, "no such file or folder"));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| RigError::file(path, format!("cannot list the folder: {e}")))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && is_gguf_name(p))
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(RigError::file(path, "no *.gguf file in the folder")),
        _ => Err(RigError::file(
            path,
            format!(
                "{} *.gguf files in the folder ({}); name the one to read",
                found.len(),
                found
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Whether the file name ends in `.gguf` (any case).
pub fn is_gguf_name(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("gguf"))
}

/// Whether `path` means a GGUF checkpoint: a `.gguf` file (or a file starting with the GGUF
/// magic), or a folder with a `.gguf` file and no `config.json`.
pub fn is_gguf_path(path: &Path) -> bool {
    if path.is_file() {
        if is_gguf_name(path) {
            return true;
        }
        let mut head = [0u8; 4];
        return std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
            .is_ok()
            && u32::from_le_bytes(head) == GGUF_MAGIC;
    }
    path.is_dir()
        && !path.join("config.json").exists()
        && std::fs::read_dir(path)
            .map(|rd| rd.flatten().any(|e| is_gguf_name(&e.path())))
            .unwrap_or(false)
}

impl Gguf {
    /// Memory-map `path` (a `.gguf` file, or a folder holding exactly one) and parse its header.
    /// Only the pages holding the header, metadata and tensor table are read.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file (and the byte offset for a malformed header).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let path = resolve_path(path)?;
        let file = std::fs::File::open(&path)
            .map_err(|e| RigError::file(&path, format!("cannot open: {e}")))?;
        // SAFETY: read-only mapping that lives as long as `self`; a file truncated by another
        // process while mapped can fault on access, as with any mmap-based loader (llama.cpp's
        // own mmap loading has the same caveat).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| RigError::file(&path, format!("cannot memory-map: {e}")))?;
        let header = parse(&map)
            .map_err(|e| RigError::file(&path, format!("not a valid GGUF file: {e}")))?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Gguf {
            path,
            header,
            map,
            index,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header.metadata.get(key)
    }

    /// `general.architecture` (`llama`, `qwen3`, ...).
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// The number of transformer blocks the file holds tensors for: 1 + the highest `N` of a
    /// tensor named `blk.N.*` (0 when there is none). A `{arch}.block_count` above it is a
    /// corrupt or hostile header: sizing anything by it (a 1 KB file declaring 2^32 − 1 blocks
    /// made `inspect` and `serve` try to allocate terabytes) is refused by its readers.
    pub fn blocks_with_tensors(&self) -> u64 {
        self.header
            .tensors
            .iter()
            .filter_map(|t| {
                t.name
                    .strip_prefix("blk.")?
                    .split('.')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .map_or(0, |m| m.saturating_add(1))
    }

    /// A tensor's table entry.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|i| &self.header.tensors[*i])
    }

    /// A tensor's raw bytes (borrowed from the mapping; bounds checked at parse time).
    ///
    /// # Errors
    /// [`RigError::BadFile`] when there is no such tensor.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], RigError> {
        let t = self.tensor(name).ok_or_else(|| {
            RigError::file(&self.path, format!("tensor '{name}' is not in the file"))
        })?;
        let s = (self.header.data_start + t.offset) as usize;
        Ok(&self.map[s..s + t.bytes as usize])
    }

    /// A tensor dequantized to f32, in storage order (row-major over the PyTorch shape).
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the tensor: missing, or of a type not dequantized.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, RigError> {
        let data = self.tensor_data(name)?;
        let t = self.tensor(name).ok_or_else(|| {
            RigError::file(&self.path, format!("tensor '{name}' is not in the file"))
        })?;
        let mut out = vec![0f32; t.elements as usize];
        crate::formats::ggml::dequantize(t.ggml_type, data, &mut out)
            .map_err(|e| RigError::file(&self.path, format!("tensor '{name}': {e}")))?;
        Ok(out)
    }

    /// FNV-1a 64 over the file size and the header bytes (metadata and tensor table): an
    /// identity of the checkpoint that reads no tensor data.
    pub fn content_hash(&self) -> String {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let end = (self.header.data_start as usize).min(self.map.len());
        for b in (self.map.len() as u64)
            .to_le_bytes()
            .iter()
            .chain(&self.map[..end])
        {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        format!("fnv1a64:{h:016x}")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GGUF writer for tests: metadata and tensors (data given raw).
    #[derive(Default)]
    pub(crate) struct Writer {
        pub kv: Vec<(String, u32, Vec<u8>)>,
        pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
        pub version: u32,
    }

    pub(crate) fn s(x: &str) -> Vec<u8> {
        let mut v = (x.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(x.as_bytes());
        v
    }

    impl Writer {
        pub fn new() -> Self {
            Writer {
                version: 3,
                ..Default::default()
            }
        }
        pub fn str(&mut self, k: &str, v: &str) -> &mut Self {
            self.kv.push((k.into(), 8, s(v)));
            self
        }
        pub fn u32(&mut self, k: &str, v: u32) -> &mut Self {
            self.kv.push((k.into(), 4, v.to_le_bytes().to_vec()));
            self
        }
        pub fn f32(&mut self, k: &str, v: f32) -> &mut Self {
            self.kv.push((k.into(), 6, v.to_le_bytes().to_vec()));
            self
        }
        pub fn bool(&mut self, k: &str, v: bool) -> &mut Self {
            self.kv.push((k.into(), 7, vec![v as u8]));
            self
        }
        pub fn strs(&mut self, k: &str, v: &[&str]) -> &mut Self {
            let mut b = 8u32.to_le_bytes().to_vec();
            b.extend((v.len() as u64).to_le_bytes());
            for x in v {
                b.extend(s(x));
            }
            self.kv.push((k.into(), 9, b));
            self
        }
        pub fn i32s(&mut self, k: &str, v: &[i32]) -> &mut Self {
            let mut b = 5u32.to_le_bytes().to_vec();
            b.extend((v.len() as u64).to_le_bytes());
            for x in v {
                b.extend(x.to_le_bytes());
            }
            self.kv.push((k.into(), 9, b));
            self
        }
        pub fn f32s(&mut self, k: &str, v: &[f32]) -> &mut Self {
            let mut b = 6u32.to_le_bytes().to_vec();
            b.extend((v.len() as u64).to_le_bytes());
            for x in v {
                b.extend(x.to_le_bytes());
            }
            self.kv.push((k.into(), 9, b));
            self
        }
        pub fn tensor(&mut self, name: &str, ne: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
            self.tensors.push((name.into(), ne.to_vec(), ty.id(), data));
            self
        }
        pub fn bytes(&self) -> Vec<u8> {
            let mut b = GGUF_MAGIC.to_le_bytes().to_vec();
            b.extend(self.version.to_le_bytes());
            b.extend((self.tensors.len() as u64).to_le_bytes());
            b.extend((self.kv.len() as u64).to_le_bytes());
            for (k, t, v) in &self.kv {
                b.extend(s(k));
                b.extend(t.to_le_bytes());
                b.extend(v);
            }
            let mut off = 0u64;
            let mut offs = Vec::new();
            for (n, ne, t, d) in &self.tensors {
                b.extend(s(n));
                b.extend((ne.len() as u32).to_le_bytes());
                for x in ne {
                    b.extend(x.to_le_bytes());
                }
                b.extend(t.to_le_bytes());
                b.extend(off.to_le_bytes());
                offs.push(off);
                off += (d.len() as u64).div_ceil(32) * 32;
            }
            while b.len() % 32 != 0 {
                b.push(0);
            }
            let start = b.len();
            for ((_, _, _, d), o) in self.tensors.iter().zip(offs) {
                b.resize(start + o as usize, 0);
                b.extend(d);
            }
            b
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn parses_metadata_of_every_type_and_the_tensor_table() {
        let mut w = Writer::new();
        w.str("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .f32("llama.rope.freq_base", 10000.0)
            .bool("tokenizer.ggml.add_bos_token", true)
            .strs("tokenizer.ggml.tokens", &["a", "b", "ab"])
            .i32s("tokenizer.ggml.token_type", &[1, 1, 3])
            .f32s("tokenizer.ggml.scores", &[0.0, -1.0, -2.0]);
        // Every scalar type, and a nested array.
        w.kv.push(("x.u8".into(), 0, vec![7]));
        w.kv.push(("x.i8".into(), 1, vec![0xFF]));
        w.kv.push(("x.u16".into(), 2, 513u16.to_le_bytes().to_vec()));
        w.kv.push(("x.i16".into(), 3, (-2i16).to_le_bytes().to_vec()));
        w.kv.push(("x.i32".into(), 5, (-3i32).to_le_bytes().to_vec()));
        w.kv.push(("x.u64".into(), 10, 1u64.to_le_bytes().to_vec()));
        w.kv.push(("x.i64".into(), 11, (-4i64).to_le_bytes().to_vec()));
        w.kv.push(("x.f64".into(), 12, 0.5f64.to_le_bytes().to_vec()));
        let mut nested = 9u32.to_le_bytes().to_vec();
        nested.extend(1u64.to_le_bytes());
        nested.extend(0u32.to_le_bytes());
        nested.extend(2u64.to_le_bytes());
        nested.extend([1, 2]);
        w.kv.push(("x.nested".into(), 9, nested));
        w.tensor("w", &[32, 2], GgmlType::F32, f32_bytes(&[1.5; 64]));
        w.tensor("q", &[32, 1], GgmlType::Q8_0, vec![0; 34]);
        let bytes = w.bytes();
        let h = parse(&bytes).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.metadata["llama.block_count"].as_u64(), Some(2));
        assert_eq!(h.metadata["x.i8"], Value::I8(-1));
        assert_eq!(h.metadata["x.u16"].as_u64(), Some(513));
        assert_eq!(h.metadata["x.i16"].as_f64(), Some(-2.0));
        assert_eq!(h.metadata["x.i32"].as_u64(), None);
        assert_eq!(h.metadata["x.i64"], Value::I64(-4));
        assert_eq!(h.metadata["x.f64"].as_f64(), Some(0.5));
        assert_eq!(
            h.metadata["x.nested"],
            Value::Array(Array::Array(vec![Array::U8(vec![1, 2])]))
        );
        assert_eq!(
            h.metadata["tokenizer.ggml.tokens"].type_name(),
            "array[string]"
        );
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].shape(), vec![2, 32]);
        assert_eq!((h.tensors[1].bytes, h.tensors[1].offset), (34, 256));
        assert_eq!(h.data_start % 32, 0);
        // Through the file API.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, &bytes).unwrap();
        let g = Gguf::open(dir.path()).unwrap();
        assert_eq!(g.dequantize("w").unwrap(), vec![1.5; 64]);
        assert_eq!(g.architecture(), Some("llama"));
        assert!(is_gguf_path(dir.path()) && is_gguf_path(&p));
        let e = g.tensor_data("nope").unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("m.gguf"), "{e}");
    }

    #[test]
    fn bad_files_get_errors_with_offsets_and_no_panic() {
        let mut w = Writer::new();
        w.str("general.architecture", "llama");
        w.tensor("w", &[32, 2], GgmlType::F32, f32_bytes(&[0.0; 64]));
        let good = w.bytes();
        // Every truncation is an error, never a panic.
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_err(), "truncated at {n}");
        }
        let e = parse(b"GGML\x03\0\0\0").unwrap_err();
        assert!(e.message.contains("not a GGUF"), "{e}");
        let mut v1 = good.clone();
        v1[4] = 1;
        assert!(parse(&v1).unwrap_err().message.contains("version 1"));
        let mut be = good.clone();
        be[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(parse(&be).unwrap_err().message.contains("big-endian"));
        // A count far beyond the file: refused before allocating.
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = parse(&huge).unwrap_err();
        assert!(e.message.contains("do not fit") && e.offset == 16, "{e}");
        // A string length beyond the file.
        let mut s = good.clone();
        s[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let e = parse(&s).unwrap_err();
        assert!(e.message.contains("string length") && e.offset == 24, "{e}");
        // Unknown tensor type.
        let mut w2 = Writer::new();
        w2.tensors.push(("t".into(), vec![4], 4, vec![0; 16]));
        let e = parse(&w2.bytes()).unwrap_err();
        assert!(e.message.contains("type id 4"), "{e}");
        // Data past the end.
        let mut w3 = Writer::new();
        w3.tensor("t", &[32, 4], GgmlType::F32, vec![0; 16]);
        let e = parse(&w3.bytes()).unwrap_err();
        assert!(e.message.contains("past the end"), "{e}");
        // Deeply nested arrays.
        let mut deep = Vec::new();
        for _ in 0..6 {
            deep.extend(9u32.to_le_bytes());
            deep.extend(1u64.to_le_bytes());
        }
        deep.extend(0u32.to_le_bytes());
        deep.extend(0u64.to_le_bytes());
        let mut w4 = Writer::new();
        w4.kv.push(("deep".into(), 9, deep));
        assert!(parse(&w4.bytes()).unwrap_err().message.contains("nested"));
        // The file API names the file.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.gguf");
        std::fs::write(&p, &good[..40]).unwrap();
        let e = format!("{:#}", Gguf::open(&p).unwrap_err());
        assert!(e.contains("bad.gguf") && e.contains("byte offset"), "{e}");
        std::fs::write(dir.path().join("two.gguf"), &good).unwrap();
        let e = format!("{:#}", Gguf::open(dir.path()).unwrap_err());
        assert!(e.contains("2 *.gguf files"), "{e}");
    }
}
