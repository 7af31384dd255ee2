//! `hf://ORG/NAME[@REV]`: a Hugging Face Hub checkpoint's metadata, read without downloading its
//! weights.
//!
//! Files come from `{endpoint}/{ORG}/{NAME}/resolve/{REV}/{file}` (the hub's file URL; `REV`
//! defaults to `main`; the endpoint is `HF_ENDPOINT` or `https://huggingface.co`, and `HF_TOKEN`
//! is sent as a bearer token for gated or private repos). `config.json` is required;
//! `hf_quant_config.json` and `model.safetensors.index.json` are read when present. Of each
//! safetensors shard only the header is fetched, with HTTP range requests, as the hub documents
//! for reading a header without the weights: `Range: bytes=0-7` gives the little-endian header
//! length N and, in `Content-Range`, the file size; `Range: bytes=8-(8+N-1)` gives the JSON
//! header. Each shard is then written as a sparse file of its real size holding only that
//! header, so [`super::inspect`] reads it like a downloaded one (it never reads tensor data).

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;

use super::headers::MAX_HEADER_BYTES;

/// The largest size rigbench believes for one safetensors shard on the hub: 1 TiB (the largest
/// published shards are tens of GB). A larger stated size is refused, naming the file.
pub const MAX_SHARD_BYTES: u64 = 1 << 40;
use crate::RigError;

/// The hub's default endpoint.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A checkpoint on the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    /// Organisation or user.
    pub org: String,
    /// Repository name.
    pub name: String,
    /// Revision: branch, tag or commit (`main` by default).
    pub rev: String,
}

impl std::fmt::Display for HubRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hf://{}/{}@{}", self.org, self.name, self.rev)
    }
}

impl std::str::FromStr for HubRef {
    type Err = String;
    /// `hf://ORG/NAME` or `hf://ORG/NAME@REV`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("hf://")
            .ok_or_else(|| format!("'{s}' is not an hf://ORG/NAME[@REV] reference"))?;
        let (repo, rev) = match rest.split_once('@') {
            Some((r, v)) => (r, v),
            None => (rest, "main"),
        };
        let ok = |x: &str| {
            !x.is_empty()
                && x.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && !x.starts_with('.')
        };
        let mut parts = repo.trim_end_matches('/').split('/');
        let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "'{s}': expected hf://ORG/NAME or hf://ORG/NAME@REVISION"
            ));
        };
        if !ok(org) || !ok(name) {
            return Err(format!(
                "'{s}': ORG and NAME may hold letters, digits, '-', '_' and '.'"
            ));
        }
        if rev.is_empty() || rev.contains("..") || rev.contains([' ', '\\', '?', '#']) {
            return Err(format!("'{s}': bad revision '{rev}'"));
        }
        Ok(HubRef {
            org: org.into(),
            name: name.into(),
            rev: rev.into(),
        })
    }
}

/// Whether a command-line checkpoint argument names the hub.
pub fn is_hub_ref(s: &str) -> bool {
    s.starts_with("hf://")
}

/// What [`fetch_metadata`] read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fetched {
    /// Metadata files written (config.json, ...).
    pub files: Vec<String>,
    /// Shards whose headers were read: (file, size in bytes, header bytes).
    pub shards: Vec<(String, u64, u64)>,
    /// Bytes transferred for headers and metadata.
    pub bytes_read: u64,
}

struct Hub<'a> {
    http: reqwest::Client,
    base: String,
    token: Option<&'a str>,
    repo: String,
}

enum Got {
    Missing,
    Data(Vec<u8>, Option<u64>),
}

fn chain(e: &reqwest::Error) -> String {
    let mut m = e.to_string();
    let mut s = std::error::Error::source(e);
    while let Some(c) = s {
        m = format!("{m}: {c}");
        s = c.source();
    }
    m
}

impl Hub<'_> {
    fn url(&self, file: &str) -> String {
        format!("{}/{file}", self.base)
    }

    /// GET a file, or its byte range `[from, to]`; at most `cap` bytes are kept (a server that
    /// ignores Range sends the whole file: the rest is not read). Returns the bytes and the
    /// file's total size when the answer states it.
    async fn get(&self, file: &str, range: Option<(u64, u64)>, cap: u64) -> anyhow::Result<Got> {
        let mut req = self.http.get(self.url(file));
        if let Some(t) = self.token {
            req = req.bearer_auth(t);
        }
        if let Some((a, b)) = range {
            req = req.header(reqwest::header::RANGE, format!("bytes={a}-{b}"));
        }
        let r = req.send().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the Hugging Face hub at {} ({}): no network here, or set HF_ENDPOINT to a mirror you can reach",
                self.url(file),
                chain(&e)
            )
        })?;
        let status = r.status().as_u16();
        match status {
            404 => return Ok(Got::Missing),
            401 | 403 => bail!(
                "{}: the hub answered {status}: the repository is gated or private (accept its terms on the hub and set HF_TOKEN), or {} does not exist",
                self.url(file),
                self.repo
            ),
            200 | 206 => {}
            s => bail!("{}: the hub answered HTTP {s}", self.url(file)),
        }
        let total = if status == 206 {
            r.headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit('/').next())
                .and_then(|v| v.trim().parse().ok())
        } else {
            r.content_length()
        };
        let skip = if status == 200 {
            range.map_or(0, |(a, _)| a)
        } else {
            0
        };
        let want = range.map_or(cap, |(a, b)| (b - a + 1).min(cap));
        let mut out = Vec::new();
        let mut seen = 0u64;
        let mut stream = r.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.with_context(|| format!("{}: reading the answer", self.url(file)))?;
            let start = skip.saturating_sub(seen).min(chunk.len() as u64) as usize;
            seen += chunk.len() as u64;
            out.extend_from_slice(&chunk[start..]);
            if out.len() as u64 >= want {
                out.truncate(want as usize);
                break;
            }
        }
        Ok(Got::Data(out, total))
    }
}

/// Fetch `r`'s metadata and safetensors headers into `dir` (see the module docs).
///
/// # Errors
/// The hub cannot be reached (the message says so, and how to use a mirror), refuses access
/// (gated or private), has no `config.json` for this repository and revision, or serves a
/// malformed index or header.
pub async fn fetch_metadata(
    r: &HubRef,
    endpoint: &str,
    token: Option<&str>,
    dir: &Path,
) -> anyhow::Result<Fetched> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .timeout(Duration::from_secs(120))
        .build()
        .context("building the HTTP client")?;
    let hub = Hub {
        http,
        base: format!(
            "{}/{}/{}/resolve/{}",
            endpoint.trim_end_matches('/'),
            r.org,
            r.name,
            r.rev
        ),
        token,
        repo: format!("{}/{}", r.org, r.name),
    };
    let mut out = Fetched::default();
    fetch_config_files(&hub, r, dir, &mut out).await?;
    let has_index = out
        .files
        .iter()
        .any(|f| f == "model.safetensors.index.json");
    let shards: Vec<String> = if has_index {
        shards_of_index(&hub, dir)?
    } else {
        vec!["model.safetensors".to_string()]
    };
    for shard in shards {
        check_shard_name(&hub, &shard)?;
        fetch_shard_header(&hub, &shard, has_index, dir, &mut out).await?;
    }
    Ok(out)
}

/// Fetch `config.json` (required), `hf_quant_config.json` and `model.safetensors.index.json`
/// (both optional) into `dir`, recording each file written and its bytes in `out`.
async fn fetch_config_files(
    hub: &Hub<'_>,
    r: &HubRef,
    dir: &Path,
    out: &mut Fetched,
) -> anyhow::Result<()> {
    const META_CAP: u64 = 64 << 20;
    for (file, required) in [
        ("config.json", true),
        ("hf_quant_config.json", false),
        ("model.safetensors.index.json", false),
    ] {
        match hub.get(file, None, META_CAP).await? {
            Got::Missing if required => bail!(RigError::file(
                hub.url(file),
                format!(
                    "not found: {} has no config.json at revision '{}' (check ORG/NAME and @REVISION)",
                    hub.repo, r.rev
                )
            )),
            Got::Missing => {}
            Got::Data(bytes, _) => {
                out.bytes_read += bytes.len() as u64;
                std::fs::write(dir.join(file), &bytes)
                    .with_context(|| format!("writing {file} into {}", dir.display()))?;
                out.files.push(file.to_string());
            }
        }
    }
    Ok(())
}

/// The distinct shard files named by the fetched `model.safetensors.index.json`'s `weight_map`,
/// sorted.
fn shards_of_index(hub: &Hub<'_>, dir: &Path) -> anyhow::Result<Vec<String>> {
    let idx: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("model.safetensors.index.json"))
            .context("reading the fetched index")?,
    )
    .map_err(|e| {
        RigError::file(
            hub.url("model.safetensors.index.json"),
            format!("not JSON: {e}"),
        )
    })?;
    let mut s: Vec<String> = idx
        .get("weight_map")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    s.sort();
    s.dedup();
    Ok(s)
}

/// Refuse a shard name that is not a plain relative path inside the repository.
fn check_shard_name(hub: &Hub<'_>, shard: &str) -> anyhow::Result<()> {
    // Only the characters of a plain relative path: a `%2e%2e` (or any `%`-escape) would
    // become `..` in the URL, so it is refused like `..` itself.
    let plain = shard
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
    if !plain
        || shard
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        || shard.len() > 255
    {
        bail!(RigError::file(
            hub.url("model.safetensors.index.json"),
            format!("names shard '{shard}', which is not a file of the repository (a shard name holds letters, digits, '.', '_', '-' and '/' only, no '..' or '%'-escapes)")
        ));
    }
    Ok(())
}

/// Fetch one shard's 8-byte header length and its JSON header, and write them into `dir` as a
/// sparse file of the shard's real size. A missing `model.safetensors` with no index is no
/// error (a checkpoint of metadata only); a shard the index names must exist.
async fn fetch_shard_header(
    hub: &Hub<'_>,
    shard: &str,
    has_index: bool,
    dir: &Path,
    out: &mut Fetched,
) -> anyhow::Result<()> {
    let (len_bytes, total) = match hub.get(shard, Some((0, 7)), 8).await? {
        Got::Missing => {
            if has_index {
                bail!(RigError::file(
                    hub.url(shard),
                    "named by model.safetensors.index.json but not on the hub"
                ));
            }
            return Ok(()); // no single-file checkpoint either: metadata only
        }
        Got::Data(b, t) => (b, t),
    };
    if len_bytes.len() < 8 {
        bail!(RigError::file(
            hub.url(shard),
            format!(
                "{} bytes: shorter than a safetensors header length",
                len_bytes.len()
            )
        ));
    }
    let n = u64::from_le_bytes(len_bytes[..8].try_into().expect("8 bytes"));
    if !(2..=MAX_HEADER_BYTES).contains(&n) {
        bail!(RigError::file(
            hub.url(shard),
            format!("safetensors header length {n} is not plausible: not a safetensors file")
        ));
    }
    let header = match hub.get(shard, Some((8, 8 + n - 1)), n).await? {
        Got::Data(b, _) if b.len() as u64 == n => b,
        Got::Data(b, _) => bail!(RigError::file(
            hub.url(shard),
            format!("header truncated: {} of {n} bytes", b.len())
        )),
        Got::Missing => bail!(RigError::file(hub.url(shard), "vanished between requests")),
    };
    out.bytes_read += 8 + n;
    let size = total.unwrap_or(8 + n).max(8 + n);
    if size > MAX_SHARD_BYTES {
        bail!(RigError::file(
            hub.url(shard),
            format!(
                "the hub states a size of {size} bytes, over rigbench's limit of {MAX_SHARD_BYTES} bytes (1 TiB) for one safetensors shard: not a plausible checkpoint file"
            )
        ));
    }
    let path = dir.join(shard);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).ok();
    }
    let mut f =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(&len_bytes[..8])?;
    f.write_all(&header)?;
    // A sparse file of the real size: the data region is never read.
    f.set_len(size).with_context(|| {
        format!(
            "cannot give {} its size of {size} bytes (a sparse file holding the header only): the file system refused it",
            path.display()
        )
    })?;
    f.seek(SeekFrom::Start(0))?;
    out.shards.push((shard.to_string(), size, n));
    Ok(())
}

/// [`fetch_metadata`] on a runtime of its own (for the synchronous CLI).
///
/// # Errors
/// See [`fetch_metadata`].
pub fn fetch_metadata_blocking(
    r: &HubRef,
    endpoint: &str,
    token: Option<&str>,
    dir: &Path,
) -> anyhow::Result<Fetched> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?
        .block_on(fetch_metadata(r, endpoint, token, dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r: HubRef = "hf://nvidia/Qwen3.6-35B-A3B-NVFP4".parse().unwrap();
        assert_eq!(
            (r.org.as_str(), r.name.as_str(), r.rev.as_str()),
            ("nvidia", "Qwen3.6-35B-A3B-NVFP4", "main")
        );
        let r: HubRef = "hf://a/b@v1.0".parse().unwrap();
        assert_eq!(r.rev, "v1.0");
        for bad in [
            "hf://a",
            "hf://a/b/c",
            "hf:///b",
            "hf://a/b@",
            "hf://../b",
            "nvidia/x",
        ] {
            assert!(bad.parse::<HubRef>().is_err(), "{bad}");
        }
    }
}
