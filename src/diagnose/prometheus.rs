//! A tolerant reader of Prometheus text exposition (format 0.0.4, as served on `/metrics` by vLLM,
//! SGLang, llama.cpp and `rigbench serve`), and of the two-column query-table rendering that the
//! Prometheus UI produces when a query result is pasted as Markdown (`series | value`).
//!
//! Tolerance rules (each one seen in real engine output, see `tests/fixtures/real/metrics/`):
//! - counter names are matched with and without the `_total` suffix (prometheus_client adds it on
//!   exposition; vLLM documents the bare name), so `vllm:num_preemptions` finds
//!   `vllm:num_preemptions_total` and vice versa;
//! - `*_created` series are creation timestamps (OpenMetrics convention), never counter values;
//!   they are kept apart in [`Exposition::created`];
//! - a family announced by `# HELP` / `# TYPE` without any sample is "no data": queries on it
//!   return `None`, never 0;
//! - a line that parses as none of the above (e.g. a literal `...`) is skipped and recorded in
//!   [`Exposition::warnings`] with its line number;
//! - histogram samples (`_bucket`, `_sum`, `_count`) may come in any order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Metric name as written (e.g. `vllm:prefix_cache_hits_total`).
    pub name: String,
    /// Label pairs (unescaped values).
    pub labels: BTreeMap<String, String>,
    /// The value (may be `±Inf` or NaN as written).
    pub value: f64,
}

/// What `# HELP` / `# TYPE` said about a metric family.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Family {
    /// The `# TYPE` (`counter`, `gauge`, `histogram`, `summary`, `untyped`), when given.
    pub kind: Option<String>,
    /// The `# HELP` text, when given.
    pub help: Option<String>,
}

/// A histogram summed over every label set except `le`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, sorted by bound; the last bound is usually `+Inf`.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`, when present.
    pub sum: Option<f64>,
    /// `_count`, when present (else the `+Inf` bucket).
    pub count: Option<f64>,
}

/// A parsed exposition (or query table).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Exposition {
    /// Every value sample, in input order (`_created` series excluded).
    pub samples: Vec<Sample>,
    /// `*_created` series: creation timestamps in seconds since the epoch, not counts.
    pub created: Vec<Sample>,
    /// Families named by `# HELP` / `# TYPE`, keyed by the name as written there.
    pub families: BTreeMap<String, Family>,
    /// Lines skipped as invalid: `line N: why: text`.
    pub warnings: Vec<String>,
}

/// The name with one trailing `_total` removed (the counter-suffix rule above).
pub fn canonical_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

impl Exposition {
    /// Parse exposition text, or a pasted query table (`series | value` rows and `-- | --`
    /// rules). Never fails: bad lines are skipped with a warning.
    pub fn parse(text: &str) -> Self {
        let mut out = Exposition::default();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                out.parse_comment(rest.trim_start());
                continue;
            }
            // Query-table rendering: a rule row, or `series | value`.
            if is_table_rule(line) {
                continue;
            }
            let parsed = match line.rsplit_once('|') {
                Some((series, value))
                    if !series.contains('"') || series.trim_end().ends_with('}') =>
                {
                    parse_series(series.trim()).and_then(|(name, labels)| {
                        parse_value(value.trim())
                            .map(|v| (name, labels, v))
                            .ok_or_else(|| format!("bad value '{}'", value.trim()))
                    })
                }
                _ => parse_sample_line(line),
            };
            match parsed {
                Ok((name, labels, value)) => {
                    let s = Sample {
                        name,
                        labels,
                        value,
                    };
                    if s.name.ends_with("_created") {
                        out.created.push(s);
                    } else {
                        out.samples.push(s);
                    }
                }
                Err(why) => out
                    .warnings
                    .push(format!("line {line_no}: {why}: {}", truncate(line, 80))),
            }
        }
        out
    }

    fn parse_comment(&mut self, rest: &str) {
        let mut parts = rest.splitn(3, char::is_whitespace);
        let kw = parts.next().unwrap_or("");
        let name = parts.next().unwrap_or("");
        let tail = parts.next().unwrap_or("").trim();
        if name.is_empty() || !valid_name(name) {
            return; // an ordinary comment
        }
        match kw {
            "HELP" => {
                self.families.entry(name.to_string()).or_default().help = Some(tail.to_string());
            }
            "TYPE" => {
                self.families.entry(name.to_string()).or_default().kind = Some(tail.to_string());
            }
            _ => {}
        }
    }

    /// Samples whose name matches `name` under the `_total` rule.
    pub fn matching<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Sample> + 'a {
        let want = canonical_name(name).to_string();
        self.samples
            .iter()
            .filter(move |s| canonical_name(&s.name) == want)
    }

    /// Whether the family is known at all (announced by HELP/TYPE, or sampled).
    pub fn has_family(&self, name: &str) -> bool {
        let want = canonical_name(name);
        self.families.keys().any(|k| canonical_name(k) == want)
            || self.matching(name).next().is_some()
    }

    /// Sum of `name` over all label sets; `None` when there is no (finite) sample ("no data").
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.sum_where(name, &[])
    }

    /// Sum of `name` over the label sets that carry every `(label, value)` in `filter`.
    pub fn sum_where(&self, name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        let mut any = false;
        let mut total = 0.0;
        for s in self.matching(name) {
            if !s.value.is_finite() {
                continue;
            }
            if filter
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            {
                any = true;
                total += s.value;
            }
        }
        any.then_some(total)
    }

    /// `name` summed per value of `label` (other labels summed over). Samples without the label
    /// are left out.
    pub fn sum_by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.matching(name) {
            if let (Some(v), true) = (s.labels.get(label), s.value.is_finite()) {
                *out.entry(v.clone()).or_insert(0.0) += s.value;
            }
        }
        out
    }

    /// Largest value of `name` over its label sets (a gauge), `None` without data.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.matching(name)
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
    }

    /// Smallest finite value of `name` (any labels): a gauge checked for impossible negatives.
    pub fn min(&self, name: &str) -> Option<f64> {
        self.matching(name)
            .map(|s| s.value)
            .filter(|v| v.is_finite())
            .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.min(v))))
    }

    /// The labels of the first sample of `name` (info-style metrics such as
    /// `vllm:cache_config_info`).
    pub fn labels_of(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.matching(name).next().map(|s| &s.labels)
    }

    /// The histogram `name` (family name, without `_bucket`), summed over label sets other
    /// than `le`; `None` when it has no bucket, sum or count sample.
    pub fn histogram(&self, name: &str) -> Option<Histogram> {
        let bucket = format!("{name}_bucket");
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.name == bucket) {
            let Some(le) = s.labels.get("le").and_then(|v| parse_value(v)) else {
                continue;
            };
            // Key by the bound's bits, ordered via total_cmp afterwards.
            let e = buckets.entry(le.to_bits()).or_insert((le, 0.0));
            e.1 += s.value;
        }
        let mut b: Vec<(f64, f64)> = buckets.into_values().collect();
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        let sum = self.sum_exact(&format!("{name}_sum"));
        let count = self
            .sum_exact(&format!("{name}_count"))
            .or_else(|| b.last().filter(|x| x.0.is_infinite()).map(|x| x.1));
        if b.is_empty() && sum.is_none() && count.is_none() {
            return None;
        }
        Some(Histogram {
            buckets: b,
            sum,
            count,
        })
    }

    fn sum_exact(&self, name: &str) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.value.is_finite())
            .map(|s| s.value)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn is_table_rule(line: &str) -> bool {
    line.contains('|') && line.chars().all(|c| matches!(c, '-' | '|' | ':' | ' '))
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Prometheus float: Go's ParseFloat plus `+Inf`, `-Inf`, `NaN` (any case).
fn parse_value(v: &str) -> Option<f64> {
    match v.to_ascii_lowercase().as_str() {
        "+inf" | "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" => Some(f64::NAN),
        _ => v.parse::<f64>().ok(),
    }
}

type Parsed = (String, BTreeMap<String, String>, f64);

/// `name{labels} value [timestamp]`.
fn parse_sample_line(line: &str) -> Result<Parsed, String> {
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = find_label_end(line, open).ok_or("unterminated label set")?;
            (&line[..=close], &line[close + 1..])
        }
        None => match line.find(char::is_whitespace) {
            Some(sp) => (&line[..sp], &line[sp..]),
            None => return Err("no value".into()),
        },
    };
    let (name, labels) = parse_series(series)?;
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = parse_value(value).ok_or_else(|| format!("bad value '{value}'"))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp '{ts}'"))?;
    }
    if fields.next().is_some() {
        return Err("trailing text after the timestamp".into());
    }
    Ok((name, labels, value))
}

/// Index of the `}` that closes the label set opened at `open`, honouring quoted values.
fn find_label_end(line: &str, open: usize) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut in_quotes = false;
    let mut i = open + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_quotes => i += 1,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// `name` or `name{a="1", b="2"}` (commas with or without spaces, optional trailing comma).
fn parse_series(series: &str) -> Result<(String, BTreeMap<String, String>), String> {
    let (name, label_text) = match series.find('{') {
        Some(open) => {
            let close = find_label_end(series, open).ok_or("unterminated label set")?;
            if close + 1 != series.len() {
                return Err("text after the label set".into());
            }
            (&series[..open], Some(&series[open + 1..close]))
        }
        None => (series, None),
    };
    let name = name.trim();
    if !valid_name(name) {
        return Err(format!("invalid metric name '{}'", truncate(name, 40)));
    }
    let mut labels = BTreeMap::new();
    if let Some(text) = label_text {
        let mut rest = text.trim();
        while !rest.is_empty() {
            let eq = rest.find('=').ok_or("label without '='")?;
            let key = rest[..eq].trim();
            if !valid_name(key) {
                return Err(format!("invalid label name '{key}'"));
            }
            let after = rest[eq + 1..].trim_start();
            let after = after.strip_prefix('"').ok_or("label value not quoted")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c2)) => value.push(c2),
                        None => return Err("dangling escape in label value".into()),
                    },
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let end = end.ok_or("unterminated label value")?;
            labels.insert(key.to_string(), value);
            rest = after[end + 1..].trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        }
    }
    Ok((name.to_string(), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real-world fixture `metrics/name`; fails when it is absent.
    fn fixture(name: &str) -> String {
        let p = crate::real_fixture(&format!("metrics/{name}"));
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("fixture {} not readable ({e})", p.display()))
    }

    #[test]
    fn total_suffix_labels_and_no_data() {
        let e = Exposition::parse(
            "# HELP vllm:prefix_cache_hits Hits.\n# TYPE vllm:prefix_cache_hits counter\n\
             vllm:prefix_cache_hits_total{model_name=\"m\"} 12\n\
             vllm:prefix_cache_hits_created{model_name=\"m\"} 1.7e9\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\",engine=\"0\"} 3\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\",engine=\"1\"} 4\n\
             vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\",engine=\"0\"} 1\n\
             vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n\
             # TYPE vllm:num_preemptions counter\n",
        );
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        assert_eq!(e.sum("vllm:prefix_cache_hits"), Some(12.0));
        assert_eq!(e.sum("vllm:prefix_cache_hits_total"), Some(12.0));
        assert_eq!(e.created.len(), 1, "_created is a timestamp, not a sample");
        let by = e.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos", "position");
        assert_eq!(by.get("0"), Some(&7.0));
        assert_eq!(by.get("1"), Some(&1.0));
        assert_eq!(
            e.labels_of("vllm:cache_config_info")
                .and_then(|l| l.get("num_gpu_blocks"))
                .map(String::as_str),
            Some("100")
        );
        // Announced but never sampled: known family, no data.
        assert!(e.has_family("vllm:num_preemptions_total"));
        assert_eq!(e.sum("vllm:num_preemptions"), None);
        assert!(!e.has_family("vllm:unknown"));
    }

    #[test]
    fn malformed_lines_are_skipped_with_warnings() {
        let e = Exposition::parse(
            "good 1\n...\nbad{a=\"x} 2\nnovalue\n9bad 3\nx{a=1} 2\ny 3 notatimestamp\nz{a=\"q\\\"uote\"} +Inf\n",
        );
        assert_eq!(e.samples.len(), 2, "{:?}", e.samples);
        assert_eq!(e.samples[1].labels["a"], "q\"uote");
        assert_eq!(e.warnings.len(), 6, "{:?}", e.warnings);
        assert!(e.warnings[0].starts_with("line 2"), "{}", e.warnings[0]);
        assert_eq!(e.sum("z"), None, "an infinite value is not a count");
    }

    #[test]
    fn fixture_query_table_dp8() {
        let text = fixture("02_vllm_specdecode-dp8-per-engine_promql-table__vllm-pr-24049.txt");
        let e = Exposition::parse(&text);
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        let per_engine = e.sum_by("vllm:spec_decode_num_drafts", "engine");
        let counts: Vec<f64> = per_engine.values().copied().collect();
        assert_eq!(counts, vec![22.0, 15.0, 29.0, 20.0, 25.0, 24.0, 27.0, 26.0]);
        assert_eq!(e.sum("vllm:spec_decode_num_drafts_total"), Some(188.0));
        // The `_created` rows are timestamps: they never reach a counter.
        assert_eq!(e.created.len(), 8);
        assert_eq!(e.sum("vllm:spec_decode_num_accepted_tokens"), None);
        assert_eq!(
            e.sum_by("vllm:spec_decode_num_accepted_tokens_per_pos", "position")
                .get("0"),
            Some(&7.0)
        );
        assert_eq!(
            e.labels_of("vllm:spec_decode_num_drafts")
                .and_then(|l| l.get("model_name"))
                .map(String::as_str),
            Some("/home/models/Qwen3-0.6B")
        );
    }

    #[test]
    fn fixture_help_type_without_samples_is_no_data() {
        let text = fixture("03_vllm-v0_metrics-help-type-without-samples__functionary-pr-263.prom");
        let e = Exposition::parse(&text);
        assert!(e.samples.is_empty());
        assert!(e.warnings.is_empty(), "{:?}", e.warnings);
        for name in [
            "vllm:num_requests_running",
            "vllm:gpu_cache_usage_perc",
            "vllm:num_preemptions",
            "vllm:num_preemptions_total",
        ] {
            assert!(e.has_family(name), "{name}");
            assert_eq!(e.sum(name), None, "{name}: no data, never zero");
            assert_eq!(e.max(name), None, "{name}");
        }
    }

    #[test]
    fn fixture_histogram_sum_first_and_ellipsis() {
        let text = fixture(
            "04_vllm-docs_metrics-endpoint-example_histogram__docs.vllm.ai-usage-metrics.prom",
        );
        let e = Exposition::parse(&text);
        assert!(
            !e.warnings.is_empty(),
            "the literal '...' line must be reported"
        );
        assert!(
            e.warnings.iter().any(|w| w.contains("...")),
            "{:?}",
            e.warnings
        );
        let h = e
            .histogram("vllm:iteration_tokens_total")
            .expect("histogram");
        assert_eq!(h.sum, Some(0.0));
        assert_eq!(h.buckets.len(), 8, "{:?}", h.buckets);
        assert!(h.buckets.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(h.buckets[0], (1.0, 3.0));
        // A histogram family is not a counter: its `_total` name does not match bucket samples.
        assert_eq!(e.sum("vllm:iteration_tokens"), None);
    }
}
