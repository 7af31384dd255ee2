//! Raw records of the load into request records: token counts, latencies, flags, and the texts
//! for the thinking check.

use super::*;

/// Turn raw records into request records (token counts, latencies, flags); returns them with
/// the texts (content, reasoning) for the thinking check.
pub(super) async fn finish_records(
    raw: Vec<RawRecord>,
    prepared: &[PreparedRequest],
    counter: &TokenCounter,
    output_fixed: bool,
    judge_repetition: bool,
) -> (Vec<RequestRecord>, Vec<(String, String)>) {
    let mut out = Vec::with_capacity(raw.len());
    let mut texts = Vec::new();
    let mut raw = raw;
    raw.sort_by_key(|r| r.index);
    for r in raw {
        let o = &r.outcome;
        let p = &prepared[r.index];
        let ok = o.error.is_none() && o.done;
        let usage = o.usage.unwrap_or_default();
        let mut token_source = None;
        let mut output_tokens = None;
        if ok {
            if let Some(n) = usage.completion_tokens {
                output_tokens = Some(n);
                token_source = Some(TokenSource::Usage);
            } else {
                let text = format!("{}{}", o.reasoning, o.content);
                if let Ok(Some(n)) = counter.count(&text).await {
                    output_tokens = Some(n as u64);
                    token_source = counter.source();
                } else {
                    output_tokens = Some(o.events.len() as u64);
                    token_source = Some(TokenSource::Chunks);
                }
            }
        }
        let reasoning_tokens = match usage.reasoning_tokens {
            Some(n) => Some(n),
            None if ok && !o.reasoning.is_empty() => counter
                .count(&o.reasoning)
                .await
                .ok()
                .flatten()
                .map(|n| n as u64),
            None => None,
        };
        let (tokens, split) = split_tokens(&o.events, output_tokens);
        let (ttft, ttfc, tpot, itl) = if ok {
            latencies(o, &tokens, output_tokens)
        } else {
            (None, None, None, Vec::new())
        };
        let delivery = (ok && !o.events.is_empty()).then(|| {
            crate::e2e::metrics::Delivery::of(
                &o.events,
                &tokens,
                output_tokens,
                split == crate::e2e::metrics::ChunkSplit::UsagePerChunk,
            )
        });
        let itl_p = crate::e2e::metrics::Percentiles::of(&itl);
        let mut rec = RequestRecord {
            index: r.index,
            scheduled_s: r.scheduled.map(|d| d.as_secs_f64()),
            sent_s: r.sent.as_secs_f64(),
            lateness_s: r.scheduled.map(|s| r.sent.as_secs_f64() - s.as_secs_f64()),
            ok,
            cancelled: o.cancelled,
            error: if ok {
                None
            } else {
                o.error
                    .clone()
                    .or_else(|| Some("stream ended without [DONE]".into()))
            },
            http_status: o.http_status,
            ttft_s: ttft,
            ttfc_s: ttfc,
            e2e_s: ok.then_some(o.end.as_secs_f64()),
            tpot_s: tpot,
            itl_mean_s: itl_p.as_ref().map(|p| p.mean),
            itl_max_s: itl_p.as_ref().map(|p| p.max),
            itl_s: itl,
            input_tokens_requested: p.input_tokens_requested,
            input_tokens_counted: p.input_tokens_counted,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
            output_tokens_requested: p.req.max_tokens,
            output_tokens,
            token_source,
            reasoning_tokens,
            chunk_split: (!o.events.is_empty()).then_some(split),
            chunks: o.chunks,
            content_chars: o.content.chars().count(),
            reasoning_chars: o.reasoning.chars().count(),
            finish_reason: o.finish_reason.clone(),
            flags: Vec::new(),
            spec: o.spec.clone(),
            opening_wave: false,
            output_tokens_retokenized: None,
            first_chunk_s: if ok {
                o.first_chunk.map(|t| t.as_secs_f64())
            } else {
                None
            },
            token_chunks: o.events.len(),
            delivery: delivery.clone(),
            retries: o.retries,
            last_token_s: if ok {
                o.events.last().map(|e| e.at.as_secs_f64())
            } else {
                None
            },
            chunk_gaps_s: if ok {
                o.events
                    .windows(2)
                    .map(|w| (w[1].at - w[0].at).as_secs_f64())
                    .collect()
            } else {
                Vec::new()
            },
        };
        let text = format!("{}{}", o.reasoning, o.content);
        rec.flags = output_flags(&rec, &text, output_fixed, judge_repetition);
        if let Some(d) = delivery.filter(|d| d.bursty) {
            rec.flags.push(d.describe());
        }
        if let Some(why) = &o.retry_reason {
            rec.flags.push(format!(
                "{}: sent again on a fresh connection after the pooled one failed before any response ({why}); its latencies include the retry",
                crate::e2e::metrics::RETRIED_FLAG
            ));
        }
        if ok && o.events.len() == 1 && output_tokens.unwrap_or(0) >= 2 {
            rec.flags.push(format!(
                "{}: {} tokens arrived in one chunk (TPOT and ITL not observable)",
                crate::e2e::metrics::SINGLE_CHUNK_FLAG,
                output_tokens.unwrap_or(0)
            ));
        }
        if ok {
            texts.push((o.content.clone(), o.reasoning.clone()));
        }
        out.push(rec);
    }
    (out, texts)
}
