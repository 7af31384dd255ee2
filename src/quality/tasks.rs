//! The task pack: short items whose answers are checked exactly (docs/quality.md, "The task
//! pack").
//!
//! How it is made: [`pack`] generates every item from templates written for this repository
//! and numbers drawn from SplitMix64 (Steele, Lea and Flood 2014) seeded with [`PACK_SEED`]
//! and the item's index, so the pack is the same on every machine and in every version of the
//! `rand` crate; each expected answer is computed by the generator itself (never typed).
//! Six kinds, [`PER_KIND`] items each: arithmetic, unit word problems, exact recall at several
//! depths of filler text, format following, string manipulation, and the output of small
//! Python programs. `rigbench quality --dump-tasks FILE` writes them as JSON lines.

use serde::{Deserialize, Serialize};

/// The pack's seed.
pub const PACK_SEED: u64 = 0x5154_4B50_4143_4B31;
/// Items per kind.
pub const PER_KIND: usize = 50;
/// The kinds, in the order items are interleaved.
pub const KINDS: [&str; 6] = ["arithmetic", "units", "recall", "format", "strings", "code"];

/// One item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// `arithmetic-007`, ...
    pub id: String,
    /// One of [`KINDS`].
    pub kind: String,
    /// The user message.
    pub prompt: String,
    /// The exact answer.
    pub answer: String,
}

/// SplitMix64: a tiny, fully specified generator (the pack's numbers must not change with a
/// crate's version).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const NUM_ONLY: &str = "Answer with the number only.";
const WORDS: [&str; 24] = [
    "apple", "river", "garden", "planet", "silver", "window", "candle", "forest", "bridge",
    "marble", "pepper", "rocket", "violin", "harbor", "lemon", "tiger", "castle", "meadow",
    "button", "ladder", "mirror", "pencil", "rabbit", "saddle",
];

fn arithmetic(r: &mut Mix) -> (String, String) {
    let (a, b) = (r.int(12, 99), r.int(3, 60));
    let (text, v) = match r.int(0, 3) {
        0 => (format!("{a} + {b}"), a + b),
        1 => (format!("{a} - {b}"), a - b),
        2 => {
            let b = r.int(3, 12);
            (format!("{a} × {b}"), a * b)
        }
        _ => {
            let c = r.int(2, 9);
            (format!("{a} + {b} × {c}"), a + b * c)
        }
    };
    (format!("What is {text}? {NUM_ONLY}"), v.to_string())
}

fn units(r: &mut Mix) -> (String, String) {
    let n = r.int(2, 15);
    match r.int(0, 5) {
        0 => (
            format!("A rope is {n} meters long. How many centimeters long is it? {NUM_ONLY}"),
            (n * 100).to_string(),
        ),
        1 => (
            format!("A film lasts {n} hours. How many minutes is that? {NUM_ONLY}"),
            (n * 60).to_string(),
        ),
        2 => (
            format!("A bag of flour weighs {n} kilograms. How many grams is that? {NUM_ONLY}"),
            (n * 1000).to_string(),
        ),
        3 => {
            let m = r.int(2, 9);
            (format!("Sam buys {n} boxes with {m} eggs in each box. How many eggs does Sam have? {NUM_ONLY}"), (n * m).to_string())
        }
        4 => {
            let p = r.int(2, 9);
            (
                format!("A pen costs {p} dollars. How many dollars do {n} pens cost? {NUM_ONLY}"),
                (n * p).to_string(),
            )
        }
        _ => {
            let s = r.int(20, 90);
            (format!("A train travels at {s} kilometers per hour for {n} hours. How many kilometers does it travel? {NUM_ONLY}"), (s * n).to_string())
        }
    }
}

fn recall(r: &mut Mix, i: usize) -> (String, String) {
    let words = [100usize, 300, 600][i % 3];
    let depth = [0.1, 0.3, 0.5, 0.7, 0.9][(i / 3) % 5];
    let code = r.int(1000, 9999).to_string();
    (
        crate::e2e::quality::recall_prompt(words, depth, &code),
        code,
    )
}

fn format_item(r: &mut Mix) -> (String, String) {
    let w = r.pick(&WORDS);
    match r.int(0, 3) {
        0 => (
            format!("Reply with the word \"{w}\" in capital letters and nothing else."),
            w.to_uppercase(),
        ),
        1 => {
            let a = r.int(1, 20);
            let b = a + r.int(2, 5);
            let list: Vec<String> = (a..=b).map(|x| x.to_string()).collect();
            (format!("Write the whole numbers from {a} to {b} in order, separated by commas with no spaces, and nothing else."), list.join(","))
        }
        2 => {
            let n = r.int(1, 99);
            (format!("Reply with a JSON object with the single key \"value\" set to the number {n}, written without spaces, and nothing else."), format!("{{\"value\":{n}}}"))
        }
        _ => {
            let v = r.pick(&WORDS);
            (format!("Reply with the words \"{w}\" and \"{v}\" joined by a hyphen, in lower case, and nothing else."), format!("{w}-{v}"))
        }
    }
}

fn strings(r: &mut Mix) -> (String, String) {
    let w = r.pick(&WORDS);
    match r.int(0, 3) {
        0 => (
            format!("Write the word \"{w}\" backwards. Answer with the reversed word only."),
            w.chars().rev().collect(),
        ),
        1 => {
            let c = w
                .chars()
                .nth((r.next() % w.len() as u64) as usize)
                .unwrap_or('a');
            let n = w.chars().filter(|x| *x == c).count();
            (
                format!(
                    "How many times does the letter \"{c}\" appear in the word \"{w}\"? {NUM_ONLY}"
                ),
                n.to_string(),
            )
        }
        2 => (
            format!("How many letters are in the word \"{w}\"? {NUM_ONLY}"),
            w.len().to_string(),
        ),
        _ => {
            let v = r.pick(&WORDS);
            let x = r.pick(&WORDS);
            let first: String = [w, v, x].iter().filter_map(|s| s.chars().next()).collect();
            (format!("Take the first letter of each of the words \"{w}\", \"{v}\" and \"{x}\", in order. Answer with the three letters only, in lower case, with no spaces."), first)
        }
    }
}

fn code(r: &mut Mix) -> (String, String) {
    let (a, b) = (r.int(1, 9), r.int(2, 6));
    let (src, out) = match r.int(0, 3) {
        0 => (
            format!("x = {a}\nfor i in range({b}):\n    x += i\nprint(x)"),
            (a + b * (b - 1) / 2).to_string(),
        ),
        1 => (
            format!("s = \"ab\" * {b}\nprint(len(s) + {a})"),
            (2 * b + a).to_string(),
        ),
        2 => {
            let xs: Vec<i64> = (0..4).map(|_| r.int(1, 20)).collect();
            let list = xs
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            (
                format!("xs = [{list}]\nprint(max(xs) - min(xs))"),
                (xs.iter().max().unwrap_or(&0) - xs.iter().min().unwrap_or(&0)).to_string(),
            )
        }
        _ => (
            format!("def f(n):\n    return n * {b} + {a}\nprint(f(f(1)))"),
            ((b + a) * b + a).to_string(),
        ),
    };
    (
        format!("What does this Python program print?\n\n```python\n{src}\n```\n\nAnswer with the printed output only."),
        out,
    )
}

/// The whole pack, kinds interleaved (`arithmetic-000`, `units-000`, ..., `code-000`,
/// `arithmetic-001`, ...), so a `--limit` keeps every kind.
pub fn pack() -> Vec<Item> {
    let mut out = Vec::with_capacity(PER_KIND * KINDS.len());
    for i in 0..PER_KIND {
        for (k, kind) in KINDS.iter().enumerate() {
            let mut r = Mix(PACK_SEED ^ ((k as u64) << 32) ^ i as u64);
            let (prompt, answer) = match k {
                0 => arithmetic(&mut r),
                1 => units(&mut r),
                2 => recall(&mut r, i),
                3 => format_item(&mut r),
                4 => strings(&mut r),
                _ => code(&mut r),
            };
            out.push(Item {
                id: format!("{kind}-{i:03}"),
                kind: kind.to_string(),
                prompt,
                answer,
            });
        }
    }
    out
}

/// Strip what comes before the answer: a `<think>…</think>` block (an engine that leaves the
/// reasoning in the content), then, when present, everything up to the last `answer is` /
/// `Answer:`.
fn final_part(text: &str) -> &str {
    let mut t = match text.rfind("</think>") {
        Some(i) => &text[i + "</think>".len()..],
        None => text,
    };
    for marker in ["answer is", "Answer is", "Answer:", "answer:"] {
        if let Some(i) = t.rfind(marker) {
            t = &t[i + marker.len()..];
        }
    }
    t
}

fn normalize(s: &str) -> String {
    let t = s.trim();
    let t = t
        .strip_prefix("```")
        .map_or(t, |x| x.trim_start_matches(|c: char| c.is_alphanumeric()));
    let t = t.strip_suffix("```").unwrap_or(t).trim();
    let t = t
        .trim_matches(|c| c == '"' || c == '\'' || c == '`' || c == '*')
        .trim();
    t.strip_suffix('.').unwrap_or(t).trim().to_string()
}

/// Whether `reply` answers `item` exactly: after the reasoning and any "the answer is" lead-in
/// are cut (see [`final_part`]), the text — trimmed, without surrounding quotes, backticks,
/// bold marks, a code fence or a final full stop — equals the answer, character for character.
pub fn check(item: &Item, reply: &str) -> bool {
    normalize(final_part(reply)) == item.answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pack_is_reproducible_and_its_answers_are_right() {
        let p = pack();
        assert_eq!(p.len(), 300);
        assert_eq!(p, pack());
        let ids: std::collections::BTreeSet<&str> = p.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids.len(), 300);
        // Spot checks of the generator's arithmetic against its own prompt.
        for it in p.iter().filter(|i| i.kind == "arithmetic") {
            let expr = it
                .prompt
                .trim_start_matches("What is ")
                .split('?')
                .next()
                .unwrap();
            let toks: Vec<&str> = expr.split(' ').collect();
            let n = |s: &str| s.parse::<i64>().unwrap();
            let v = match toks.as_slice() {
                [a, "+", b] => n(a) + n(b),
                [a, "-", b] => n(a) - n(b),
                [a, "×", b] => n(a) * n(b),
                [a, "+", b, "×", c] => n(a) + n(b) * n(c),
                _ => panic!("{expr}"),
            };
            assert_eq!(v.to_string(), it.answer, "{}", it.id);
        }
        let rec = p.iter().find(|i| i.kind == "recall").unwrap();
        assert!(rec.prompt.contains(&format!("pass code is {}", rec.answer)));
    }

    #[test]
    fn checking_is_exact_after_the_lead_in() {
        let it = Item {
            id: "x".into(),
            kind: "arithmetic".into(),
            prompt: String::new(),
            answer: "85".into(),
        };
        assert!(check(&it, "85"));
        assert!(check(&it, " 85.\n"));
        assert!(check(&it, "<think>47+38 is 85</think>\n\n**85**"));
        assert!(check(&it, "The answer is 85."));
        assert!(!check(&it, "850"));
        assert!(!check(&it, "It is 85 or 86"));
        let j = Item {
            answer: "{\"value\":7}".into(),
            ..it
        };
        assert!(check(&j, "```json\n{\"value\":7}\n```"));
    }
}
