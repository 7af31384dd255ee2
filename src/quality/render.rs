//! The quality comparison's Markdown: one row per candidate (verdict beside speed), the noise
//! floor, the conditions and the published anchors as context.

use super::QualityComparison;
use crate::output::table::markdown_table;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn ci(c: Option<(f64, f64)>, digits: usize) -> String {
    c.map_or("—".into(), |(lo, hi)| {
        format!("[{lo:.digits$}, {hi:.digits$}]")
    })
}

/// Tail mass above which the report says the KL is understated (docs/quality.md, "Figures").
const TAIL_WARN: f64 = 0.05;

/// The section, `##` level.
pub fn render_markdown(q: &QualityComparison) -> String {
    let mut o = String::from("## Quality against the reference\n\n");
    o.push_str(&format!(
        "Reference: {}. Teacher-forced on {} positions of the corpus (SHA-256 {}…), top-{} log-probabilities from {}; KL in nats from the top-k with a tail bucket (docs/quality.md). Reference perplexity {}. Noise floor (the reference against a second run of itself): KL {:.2e}, top-1 {}.\n\n",
        q.reference_how,
        q.positions,
        &q.corpus_sha256[..12.min(q.corpus_sha256.len())],
        q.top_k,
        q.logprob_source,
        q.reference_perplexity.map_or("—".into(), |p| format!("{p:.3}")),
        q.noise_floor.kl_ab,
        pct(q.noise_floor.top1_agreement),
    ));
    let rows: Vec<Vec<String>> = q
        .candidates
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                match (c.verdict.as_str(), c.would_need) {
                    ("undecided", Some(n)) => format!("undecided (would need {n} items)"),
                    (v, _) => v.to_string(),
                },
                format!("{:.4}", c.kl_ref_to_candidate),
                format!("{:.4}", c.kl_candidate_to_ref),
                ci(c.kl_excess_ci, 4),
                pct(c.top1_agreement),
                c.fidelity
                    .delta_logprob
                    .map_or("—".into(), |d| format!("{d:+.4}")),
                c.fidelity
                    .perplexity_b
                    .map_or("—".into(), |p| format!("{p:.3}")),
                ci(c.ppl_ratio_ci, 4),
                format!(
                    "{}/{} vs {}/{}",
                    c.tasks.passed_candidate,
                    c.tasks.items,
                    c.tasks.passed_reference,
                    c.tasks.items
                ),
                format!("{:.3}", c.mcnemar_p),
                c.speed
                    .as_ref()
                    .map_or("—".into(), |s| format!("{:.1}", s.output_tokens_per_s)),
            ]
        })
        .collect();
    o.push_str(&markdown_table(
        &[
            "candidate",
            "verdict",
            "KL(ref‖cand)",
            "KL(cand‖ref)",
            "KL above floor, 95% CI",
            "top-1",
            "Δ log-prob",
            "perplexity",
            "ppl ratio, 95% CI",
            "tasks (cand vs ref)",
            "McNemar p",
            "output tok/s",
        ],
        &rows,
    ));
    if let Some(s) = &q.reference_speed {
        o.push_str(&format!(
            "\nReference speed: {:.1} output tok/s. Speed conditions: {}.\n",
            s.output_tokens_per_s, s.conditions
        ));
    }
    o.push_str(&format!(
        "\nTask pack: {}; variants {}. Verdict rules: McNemar exact α {}, smallest effect that matters {} points at power {:.0}%, perplexity margin {:.0}%.\n",
        q.task_pack,
        q.variants.join(", "),
        q.rules.alpha,
        100.0 * q.rules.min_effect,
        100.0 * q.rules.power,
        100.0 * q.rules.ppl_margin
    ));
    for c in &q.candidates {
        o.push_str(&format!(
            "\n- `{}` ({}): {}\n",
            c.name,
            c.how,
            c.reasons.join("; ")
        ));
        o.push_str(&format!(
            "  tail mass outside the top-{}: reference {:.3}, candidate {:.3}\n",
            q.top_k, c.fidelity.tail_mass_a, c.fidelity.tail_mass_b
        ));
        let tail = c.fidelity.tail_mass_a.max(c.fidelity.tail_mass_b);
        if tail > TAIL_WARN {
            o.push_str(&format!(
                "  the KL above is low by an unknown amount: {:.0}% of a side's mass is in one tail bucket (on SmolLM2, 20% in the tail put the KL 32% low; 2% put it 3% low, docs/quality.md); give a larger --top-k, and the engines a --max-logprobs at least as large\n",
                tail * 100.0
            ));
        }
    }
    o.push_str(
        "\nPublished bands, as context only (other models; never a pass mark for this one): ",
    );
    let a: Vec<String> = q
        .anchors
        .iter()
        .map(|a| {
            let band = |(lo, hi): (f64, f64), f: &dyn Fn(f64) -> String| {
                if lo == hi {
                    format!("≈ {}", f(lo))
                } else {
                    format!("{}–{}", f(lo), f(hi))
                }
            };
            format!(
                "{} on a {} model, KL {} and top-1 {}",
                a.format,
                a.model_class,
                band(a.kl, &|x| format!("{x}")),
                band(a.top1, &|x| format!("{:.0}%", 100.0 * x))
            )
        })
        .collect();
    o.push_str(&a.join("; "));
    o.push_str(".\n");
    for n in &q.notes {
        o.push_str(&format!("\nNote: {n}\n"));
    }
    o
}
