//! Text out of tokens: incremental detokenization, stop strings held back until they cannot
//! match, EOS, and the split of generated text into reasoning and content.

use super::*;

pub(super) struct TextChannel {
    pub(super) dec: IncrementalDecoder,
    pub(super) pending: String,
}

impl TextChannel {
    pub(super) fn new() -> Self {
        TextChannel {
            dec: IncrementalDecoder::new(),
            pending: String::new(),
        }
    }

    /// Add decoded text; returns (text to emit, stop string matched).
    pub(super) fn push(
        &mut self,
        text: &str,
        stops: &[String],
        hold: usize,
        last: bool,
    ) -> (String, bool) {
        self.pending.push_str(text);
        let found = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(i) = found {
            let out = self.pending[..i].to_string();
            self.pending.clear();
            return (out, true);
        }
        let mut cut = if last {
            self.pending.len()
        } else {
            self.pending.len().saturating_sub(hold)
        };
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        let out: String = self.pending.drain(..cut).collect();
        (out, false)
    }
}

pub(super) struct TextState {
    pub(super) mode_reasoning: bool,
    pub(super) detect: bool,
    pub(super) first: bool,
    pub(super) think_start: Option<u32>,
    pub(super) think_end: Option<u32>,
    pub(super) reasoning: TextChannel,
    pub(super) content: TextChannel,
    pub(super) stops: Vec<String>,
    pub(super) hold: usize,
    /// Whether stop strings are matched (false until `min_tokens` tokens are out).
    pub(super) stops_armed: bool,
}

#[derive(Default)]
pub(super) struct Delta {
    pub(super) reasoning: String,
    pub(super) content: String,
    pub(super) stopped: bool,
}

impl TextState {
    pub(super) fn new(mode: ReasoningMode, tok: &Tokenizer, stops: Vec<String>) -> Self {
        let hold = stops
            .iter()
            .map(|s| s.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let usable = tok.think_end.is_some();
        TextState {
            mode_reasoning: usable && mode == ReasoningMode::InThink,
            detect: usable && mode == ReasoningMode::Detect,
            first: true,
            think_start: tok.think_start,
            think_end: tok.think_end,
            reasoning: TextChannel::new(),
            content: TextChannel::new(),
            stops,
            hold,
            stops_armed: true,
        }
    }

    pub(super) fn push(&mut self, tok: &Tokenizer, id: u32, d: &mut Delta) {
        let none: [String; 0] = [];
        let stops: &[String] = if self.stops_armed { &self.stops } else { &none };
        let first = std::mem::replace(&mut self.first, false);
        if first && self.detect && Some(id) == self.think_start {
            self.mode_reasoning = true;
            return;
        }
        if self.mode_reasoning {
            if Some(id) == self.think_end {
                let tail = self.reasoning.dec.flush(tok);
                let (out, stopped) = self.reasoning.push(&tail, stops, self.hold, true);
                d.reasoning.push_str(&out);
                d.stopped |= stopped;
                self.mode_reasoning = false;
                return;
            }
            let t = self.reasoning.dec.step(tok, id);
            let (out, stopped) = self.reasoning.push(&t, stops, self.hold, false);
            d.reasoning.push_str(&out);
            d.stopped |= stopped;
        } else {
            let t = self.content.dec.step(tok, id);
            let (out, stopped) = self.content.push(&t, stops, self.hold, false);
            d.content.push_str(&out);
            d.stopped |= stopped;
        }
    }

    pub(super) fn finish(&mut self, tok: &Tokenizer, d: &mut Delta) {
        for (ch, out) in [
            (&mut self.reasoning, &mut d.reasoning),
            (&mut self.content, &mut d.content),
        ] {
            let tail = ch.dec.flush(tok);
            let (o, _) = ch.push(&tail, &self.stops, self.hold, true);
            out.push_str(&o);
        }
    }
}
