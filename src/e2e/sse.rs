//! Server-Sent Events framing, as the WHATWG HTML "server-sent events" grammar has it: fields
//! `data:` with one optional space, events end at a blank line, `\n` or `\r\n` line ends, `:`
//! comments. Used by the e2e client (`super::client`) and the fuzz harness; what an event's data
//! means is `super::stream`'s concern.

use anyhow::Context;

/// An incremental SSE decoder: feed bytes, get the `data` payload of each complete event.
///
/// Memory is bounded: an event (its pending line plus the data lines gathered so far) larger
/// than [`MAX_SSE_EVENT_BYTES`] is an error, not an ever-growing buffer. Work is linear in the
/// bytes fed, however they are cut into reads.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    data: Option<String>,
}

/// The largest SSE event accepted, bytes (16 MiB: a chunk of an OpenAI stream is a few hundred
/// bytes; a final chunk with logprobs or metrics a few hundred KiB).
pub const MAX_SSE_EVENT_BYTES: usize = 16 << 20;

impl SseDecoder {
    /// Feed bytes; returns the data of every event completed by them.
    ///
    /// # Errors
    /// A line that is not UTF-8, or an event larger than [`MAX_SSE_EVENT_BYTES`].
    pub fn push(&mut self, bytes: &[u8]) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        // Only the new bytes can hold the next newline: search from where the old ones ended.
        let mut searched = self.buf.len();
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(off) = self.buf[searched..].iter().position(|b| *b == b'\n') {
            let nl = searched + off;
            let mut line = &self.buf[start..nl];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = std::str::from_utf8(line)
                .context("SSE line is not UTF-8")?
                .to_string();
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
            start = nl + 1;
            searched = start;
        }
        self.buf.drain(..start);
        let pending = self.buf.len() + self.data.as_ref().map_or(0, String::len);
        if pending > MAX_SSE_EVENT_BYTES {
            self.buf.clear();
            self.data = None;
            anyhow::bail!(
                "SSE event larger than {} MiB without an end: not an OpenAI-compatible stream",
                MAX_SSE_EVENT_BYTES >> 20
            );
        }
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
        None
    }

    /// End of stream: the data of an event left without its closing blank line, if any
    /// (tolerated; the caller notes it).
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() {
            if let Ok(s) = String::from_utf8(rest) {
                let s = s.trim_end_matches('\r').to_string();
                if let Some(ev) = self.line(&s) {
                    return Some(ev);
                }
            }
        }
        self.data.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_framing() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: {\"a\"").unwrap().is_empty());
        assert_eq!(d.push(b":1}\r\n\r\n").unwrap(), vec!["{\"a\":1}"]);
        assert_eq!(
            d.push(b": keep-alive\n\ndata:x\ndata: y\nevent: e\n\ndata: [DONE]\n\n")
                .unwrap(),
            vec!["x\ny", "[DONE]"]
        );
        assert!(d.push(b"data: tail").unwrap().is_empty());
        assert_eq!(d.finish().as_deref(), Some("tail"));
        assert!(SseDecoder::default().push(b"data: \xff\xfe\n\n").is_err());
    }

    #[test]
    fn sse_memory_is_bounded_and_cuts_do_not_matter() {
        // An engine that sends bytes without ever ending a line: an error at the bound.
        let mut d = SseDecoder::default();
        let junk = vec![b'x'; 1 << 20];
        let mut failed = false;
        for _ in 0..(MAX_SSE_EVENT_BYTES >> 20) + 2 {
            if d.push(&junk).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed, "an endless line was buffered without bound");
        // Data lines without the blank line that ends the event count too.
        let mut d = SseDecoder::default();
        let line = format!("data: {}\n", "y".repeat(1 << 20));
        let failed = (0..(MAX_SSE_EVENT_BYTES >> 20) + 2).any(|_| d.push(line.as_bytes()).is_err());
        assert!(failed, "an endless event was buffered without bound");
        // Many events in one read, and the same bytes one at a time, give the same events.
        let stream: String = (0..20_000).map(|i| format!("data: {i}\r\n\n")).collect();
        let whole = SseDecoder::default().push(stream.as_bytes()).unwrap();
        let mut d = SseDecoder::default();
        let mut bytewise = Vec::new();
        for b in stream.as_bytes() {
            bytewise.extend(d.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(whole.len(), 20_000);
        assert_eq!(whole, bytewise);
        assert_eq!(whole[19_999], "19999");
    }
}
