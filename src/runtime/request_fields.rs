//! Every top-level field of vLLM's OpenAI chat-completions and completions requests, and what
//! `rigbench serve` does with each: honoured, accepted without effect, or refused with a 400
//! naming it unless it holds vLLM's neutral value. A field vLLM does not know is refused too.
//!
//! Source: vLLM's `vllm/entrypoints/openai/protocol.py` (`ChatCompletionRequest`,
//! `CompletionRequest`: the OpenAI fields, the `*-sampling-params` and `*-extra-params`
//! blocks). The same table, as prose, is in docs/runtime.md ("Request fields"); a test keeps the
//! two equal.

use serde_json::Value;

/// Which request a field belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// What the server does with a field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Handling {
    /// Read and acted on (its own checks may still refuse a value: `n` other than 1, ...).
    Honoured,
    /// Accepted and not used; the output is the same (an end-user id, the request id).
    Accepted,
    /// Refused (400 naming the field) unless it holds the neutral value (`null` always is).
    Refused(Neutral),
}

/// The value of a refused field that asks for nothing (vLLM's default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Neutral {
    /// Only `null` (or absent).
    Null,
    /// This boolean.
    Bool(bool),
    /// This number.
    Num(f64),
    /// An empty list.
    EmptyList,
    /// An empty object.
    EmptyObject,
    /// One of these strings.
    Str(&'static [&'static str]),
    /// `{"type": "text"}` (the response format that constrains nothing).
    TextFormat,
    /// The request's own default: `false` on chat (the template adds them), `true` on
    /// completions (the server's tokenization of each does the same).
    EndpointDefault,
}

impl Neutral {
    /// Whether `v` asks for nothing on `ep`.
    pub fn holds(&self, v: &Value, ep: Endpoint) -> bool {
        if v.is_null() {
            return true;
        }
        match self {
            Neutral::Null => false,
            Neutral::Bool(b) => v.as_bool() == Some(*b),
            Neutral::Num(x) => v.as_f64() == Some(*x),
            Neutral::EmptyList => v.as_array().is_some_and(|a| a.is_empty()),
            Neutral::EmptyObject => v.as_object().is_some_and(|o| o.is_empty()),
            Neutral::Str(s) => v.as_str().is_some_and(|x| s.contains(&x)),
            Neutral::TextFormat => {
                v.as_object().is_some_and(|o| o.len() == 1)
                    && v.get("type").and_then(Value::as_str) == Some("text")
            }
            Neutral::EndpointDefault => v.as_bool() == Some(ep == Endpoint::Completions),
        }
    }

    /// The neutral value as the docs and errors write it.
    pub fn describe(&self) -> String {
        match self {
            Neutral::Null => "null".into(),
            Neutral::Bool(b) => b.to_string(),
            Neutral::Num(x) => format!("{x}"),
            Neutral::EmptyList => "[]".into(),
            Neutral::EmptyObject => "{}".into(),
            Neutral::Str(s) => s
                .iter()
                .map(|x| format!("\"{x}\""))
                .collect::<Vec<_>>()
                .join(" or "),
            Neutral::TextFormat => "{\"type\": \"text\"}".into(),
            Neutral::EndpointDefault => "false on chat, true on completions".into(),
        }
    }
}

/// One field: its name, the requests it belongs to (`C` chat, `P` completions, `B` both) and
/// its handling.
pub struct Field {
    /// The JSON key.
    pub name: &'static str,
    /// `'C'`, `'P'` or `'B'`.
    pub on: char,
    /// What the server does with it.
    pub handling: Handling,
}

use Handling::{Accepted, Honoured, Refused};
use Neutral as N;

const fn f(name: &'static str, on: char, handling: Handling) -> Field {
    Field { name, on, handling }
}

/// The table (vLLM's fields in protocol.py's order, then rigbench's own extension).
pub const FIELDS: &[Field] = &[
    // OpenAI's fields.
    f("messages", 'C', Honoured),
    f("model", 'B', Honoured),
    f("prompt", 'P', Honoured),
    f("prompt_embeds", 'P', Refused(N::Null)),
    f("best_of", 'B', Refused(N::Num(1.0))),
    f("echo", 'P', Honoured),
    f("frequency_penalty", 'B', Refused(N::Num(0.0))),
    f("logit_bias", 'B', Refused(N::EmptyObject)),
    f("logprobs", 'B', Honoured),
    f("top_logprobs", 'C', Honoured),
    f("max_tokens", 'B', Honoured),
    f("max_completion_tokens", 'B', Honoured),
    f("n", 'B', Honoured),
    f("presence_penalty", 'B', Refused(N::Num(0.0))),
    f("response_format", 'B', Refused(N::TextFormat)),
    f("seed", 'B', Honoured),
    f("stop", 'B', Honoured),
    f("stream", 'B', Honoured),
    f("stream_options", 'B', Honoured),
    f("suffix", 'P', Refused(N::Null)),
    f("temperature", 'B', Honoured),
    f("top_p", 'B', Honoured),
    f("tools", 'C', Refused(N::EmptyList)),
    f("tool_choice", 'C', Refused(N::Str(&["none", "auto"]))),
    f("reasoning_effort", 'C', Refused(N::Null)),
    f("include_reasoning", 'C', Refused(N::Bool(true))),
    f("parallel_tool_calls", 'C', Accepted),
    f("user", 'B', Accepted),
    // vLLM's sampling parameters.
    f("use_beam_search", 'B', Refused(N::Bool(false))),
    f("top_k", 'B', Honoured),
    f("min_p", 'B', Refused(N::Num(0.0))),
    f("repetition_penalty", 'B', Refused(N::Num(1.0))),
    f("length_penalty", 'B', Refused(N::Num(1.0))),
    f("stop_token_ids", 'B', Refused(N::EmptyList)),
    f("include_stop_str_in_output", 'B', Refused(N::Bool(false))),
    f("ignore_eos", 'B', Honoured),
    f("min_tokens", 'B', Honoured),
    f("skip_special_tokens", 'B', Refused(N::Bool(true))),
    f("spaces_between_special_tokens", 'B', Refused(N::Bool(true))),
    f("truncate_prompt_tokens", 'B', Refused(N::Null)),
    f("prompt_logprobs", 'B', Honoured),
    f("allowed_token_ids", 'B', Refused(N::Null)),
    f("bad_words", 'C', Refused(N::EmptyList)),
    // vLLM's extra parameters.
    f("add_generation_prompt", 'C', Honoured),
    f("continue_final_message", 'C', Refused(N::Bool(false))),
    f("add_special_tokens", 'B', Refused(N::EndpointDefault)),
    f("documents", 'C', Refused(N::Null)),
    f("chat_template", 'C', Refused(N::Null)),
    f("chat_template_kwargs", 'C', Honoured),
    f("mm_processor_kwargs", 'C', Refused(N::Null)),
    f("guided_json", 'B', Refused(N::Null)),
    f("guided_regex", 'B', Refused(N::Null)),
    f("guided_choice", 'B', Refused(N::Null)),
    f("guided_grammar", 'B', Refused(N::Null)),
    f("structural_tag", 'C', Refused(N::Null)),
    f("guided_decoding_backend", 'B', Refused(N::Null)),
    f("guided_whitespace_pattern", 'B', Refused(N::Null)),
    f("priority", 'B', Refused(N::Num(0.0))),
    f("request_id", 'B', Accepted),
    f("logits_processors", 'B', Refused(N::Null)),
    f("return_tokens_as_token_ids", 'B', Refused(N::Bool(false))),
    f("cache_salt", 'B', Refused(N::Null)),
    f("kv_transfer_params", 'B', Refused(N::Null)),
    f("vllm_xargs", 'B', Refused(N::Null)),
];

/// The entry of `name` on `ep` (`None`: not a field of that request).
pub fn lookup(name: &str, ep: Endpoint) -> Option<&'static Field> {
    FIELDS.iter().find(|x| {
        x.name == name
            && matches!(
                (x.on, ep),
                ('B', _) | ('C', Endpoint::Chat) | ('P', Endpoint::Completions)
            )
    })
}

/// A field the server refuses: its name (static for a known field) and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The field of the table, when it is one (the error's `param`).
    pub param: Option<&'static str>,
    /// What is wrong and what to do.
    pub message: String,
}

/// Check a request body's top-level fields against [`FIELDS`]: the first field that is not a
/// field of this request, or a refused one holding anything but its neutral value, is an error
/// naming it (keys in the body's order).
pub fn check(body: &serde_json::Map<String, Value>, ep: Endpoint) -> Result<(), Refusal> {
    let what = match ep {
        Endpoint::Chat => "chat completions",
        Endpoint::Completions => "completions",
    };
    for (k, v) in body {
        match lookup(k, ep) {
            None => {
                return Err(Refusal {
                    param: None,
                    message: format!(
                        "unknown field '{k}': not a field of vLLM's OpenAI {what} request (vllm/entrypoints/openai/protocol.py), so rigbench serve refuses it instead of ignoring it; docs/runtime.md lists the fields"
                    ),
                })
            }
            Some(Field {
                name,
                handling: Refused(n),
                ..
            }) if !n.holds(v, ep) => {
                return Err(Refusal {
                    param: Some(*name),
                    message: format!(
                        "'{name}' is not supported by rigbench serve (only {}, which asks for nothing); drop it from the request (docs/runtime.md lists what is honoured)",
                        if *n == N::Null {
                            "null".to_string()
                        } else {
                            format!("{} or null", n.describe())
                        }
                    ),
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The table as Markdown rows, `| field | chat | completions | rigbench serve |` (the block of
/// docs/runtime.md between its markers).
pub fn markdown_rows() -> String {
    let mut o = String::new();
    for x in FIELDS {
        let (c, p) = match x.on {
            'C' => ("yes", "—"),
            'P' => ("—", "yes"),
            _ => ("yes", "yes"),
        };
        let h = match x.handling {
            Honoured => "honoured".to_string(),
            Accepted => "accepted, not used (no effect on the output)".to_string(),
            Refused(N::Null) => "refused (400) unless null".to_string(),
            Refused(n) => format!("refused (400) unless {} or null", n.describe()),
        };
        o.push_str(&format!("| `{}` | {c} | {p} | {h} |\n", x.name));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn neutral_values_pass_and_others_are_named() {
        let ok = obj(json!({"model": "m", "messages": [], "frequency_penalty": 0,
            "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0, "best_of": null,
            "use_beam_search": false, "logit_bias": {}, "stop_token_ids": [],
            "skip_special_tokens": true, "response_format": {"type": "text"},
            "tool_choice": "none", "user": "u1", "min_tokens": 4, "top_k": 5,
            "add_special_tokens": false}));
        assert_eq!(check(&ok, Endpoint::Chat), Ok(()));
        for (k, v) in [
            ("frequency_penalty", json!(0.5)),
            ("repetition_penalty", json!(1.1)),
            ("min_p", json!(0.05)),
            ("logit_bias", json!({"42": 5})),
            ("use_beam_search", json!(true)),
            ("response_format", json!({"type": "json_object"})),
            ("guided_json", json!({"type": "object"})),
            ("stop_token_ids", json!([2])),
            ("include_reasoning", json!(false)),
        ] {
            let mut b = obj(json!({"model": "m", "messages": []}));
            b.insert(k.into(), v.clone());
            let e = check(&b, Endpoint::Chat).unwrap_err();
            assert_eq!(e.param, Some(k), "{k}");
            assert!(e.message.contains(&format!("'{k}'")), "{}", e.message);
        }
    }

    #[test]
    fn unknown_and_wrong_endpoint_fields_are_refused() {
        let b = obj(json!({"prompt": "x", "max_tokenz": 5}));
        let e = check(&b, Endpoint::Completions).unwrap_err();
        assert!(
            e.param.is_none() && e.message.contains("'max_tokenz'"),
            "{e:?}"
        );
        // messages is a chat field; suffix a completions one.
        assert!(check(&obj(json!({"messages": []})), Endpoint::Completions).is_err());
        assert!(check(&obj(json!({"suffix": "x"})), Endpoint::Chat).is_err());
        assert_eq!(
            check(&obj(json!({"suffix": null})), Endpoint::Completions),
            Ok(())
        );
        // add_special_tokens: the endpoint's own default passes, the other value does not.
        let t = obj(json!({"add_special_tokens": true}));
        assert_eq!(check(&t, Endpoint::Completions), Ok(()));
        assert_eq!(
            check(&t, Endpoint::Chat).unwrap_err().param,
            Some("add_special_tokens")
        );
    }

    /// docs/runtime.md carries the table as this module renders it.
    #[test]
    fn the_docs_table_is_this_table() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/runtime.md");
        let doc = std::fs::read_to_string(&p).unwrap();
        let rows = markdown_rows();
        assert!(
            doc.contains(&rows),
            "docs/runtime.md's request-field table differs from request_fields::FIELDS; paste:\n{rows}"
        );
        // Every field once.
        let mut names: Vec<&str> = FIELDS.iter().map(|x| x.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
