//! Chat templates: the checkpoint's Jinja template (`tokenizer_config.json`'s `chat_template`,
//! or `chat_template.jinja`) rendered with `minijinja` and `minijinja-contrib`'s Python
//! compatibility (as transformers' `apply_chat_template` does with Jinja2: `trim_blocks`,
//! `lstrip_blocks`, `raise_exception`, `strftime_now`), or a built-in ChatML/Qwen3-style
//! template.
//!
//! `chat_template_kwargs` (e.g. `enable_thinking`) are passed as top-level template variables,
//! as vLLM does. The built-in template follows Qwen3's convention for thinking, with thinking
//! OFF unless a request asks for it: with `enable_thinking` true the assistant turn opens a
//! `<think>` block, so generated text up to `</think>` is reasoning; otherwise it starts with an
//! empty, closed `<think>` block. (Off by default because the built-in template serves the
//! synthetic presets, whose random weights seldom close a `<think>` block: with thinking on by
//! default, a first `curl` would get only reasoning and empty content.)

use std::path::Path;

use minijinja::{Environment, ErrorKind};
use serde_json::Value;

use crate::RigError;

/// The built-in template (ChatML with Qwen3's thinking switch; thinking off unless
/// `enable_thinking` is true).
pub const BUILTIN_TEMPLATE: &str = concat!(
    "{%- for message in messages %}",
    "{{ '<|im_start|>' ~ message.role ~ '\\n' ~ (message.content or '') ~ '<|im_end|>\\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}",
    "{{ '<|im_start|>assistant\\n' }}",
    "{%- if enable_thinking is defined and enable_thinking is true %}",
    "{{ '<think>\\n' }}",
    "{%- else %}",
    "{{ '<think>\\n\\n</think>\\n\\n' }}",
    "{%- endif %}",
    "{%- endif %}"
);

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `"built-in"` or the file it came from.
    pub source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// The built-in template.
    pub fn builtin() -> Self {
        // The built-in template is a constant that compiles (tested below).
        Self::compile(BUILTIN_TEMPLATE.to_string(), "built-in".into(), None, None)
            .unwrap_or_else(|e| panic!("built-in chat template does not compile: {e}"))
    }

    /// Compile a template source.
    ///
    /// # Errors
    /// The template's syntax error.
    pub fn compile(
        source: String,
        origin: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, minijinja::Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            chrono::Local::now().format(&fmt).to_string()
        });
        env.add_template_owned(NAME, source)?;
        Ok(ChatTemplate {
            env,
            source: origin,
            bos_token,
            eos_token,
        })
    }

    /// The checkpoint's template: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}` where `default` is taken),
    /// else `None`.
    ///
    /// # Errors
    /// [`RigError::BadFile`] naming the file when it is unreadable, malformed, or the template
    /// does not compile.
    pub fn from_dir(
        dir: &Path,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> anyhow::Result<Option<Self>> {
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = if jinja.is_file() {
            let s = std::fs::read_to_string(&jinja)
                .map_err(|e| RigError::file(&jinja, format!("cannot read: {e}")))?;
            (s, jinja)
        } else {
            let cfg = dir.join("tokenizer_config.json");
            if !cfg.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&cfg)
                .map_err(|e| RigError::file(&cfg, format!("cannot read: {e}")))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| RigError::file(&cfg, format!("not valid JSON: {e}")))?;
            let t = match v.get("chat_template") {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|e| e.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        RigError::file(&cfg, "chat_template list has no template entry")
                    })?
                    .to_string(),
                Some(_) => {
                    return Err(RigError::file(
                        &cfg,
                        "chat_template is neither a string nor a list",
                    )
                    .into())
                }
            };
            (t, cfg)
        };
        let t = Self::compile(source, path.display().to_string(), bos_token, eos_token)
            .map_err(|e| RigError::file(&path, format!("chat template does not compile: {e}")))?;
        Ok(Some(t))
    }

    /// Render `messages` (OpenAI chat messages; list-of-parts content is flattened to its text
    /// parts joined by newlines, as vLLM does for string templates) with the generation prompt
    /// and `kwargs` as extra top-level variables.
    ///
    /// # Errors
    /// A message naming the problem (the template's own `raise_exception` text included).
    pub fn render(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<String, String> {
        let msgs: Vec<Value> = messages.iter().map(flatten_content).collect();
        let mut ctx = serde_json::Map::new();
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), Value::Array(msgs));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );
        ctx.entry("bos_token").or_insert_with(|| {
            self.bos_token
                .clone()
                .map(Value::String)
                .unwrap_or(Value::String(String::new()))
        });
        ctx.entry("eos_token").or_insert_with(|| {
            self.eos_token
                .clone()
                .map(Value::String)
                .unwrap_or(Value::String(String::new()))
        });
        let tmpl = self.env.get_template(NAME).map_err(|e| e.to_string())?;
        tmpl.render(minijinja::Value::from_serialize(Value::Object(ctx)))
            .map_err(|e| {
                let mut msg = format!("chat template failed: {e}");
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                msg
            })
    }
}

fn flatten_content(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(Value::Array(parts)) = m.get("content") {
        let text: Vec<&str> = parts
            .iter()
            .filter_map(|p| {
                if p.get("type").and_then(Value::as_str).unwrap_or("text") == "text" {
                    p.get("text").and_then(Value::as_str)
                } else {
                    None
                }
            })
            .collect();
        let joined = text.join("\n");
        if let Some(obj) = m.as_object_mut() {
            obj.insert("content".into(), Value::String(joined));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kw(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn builtin_thinking_on_and_off() {
        let t = ChatTemplate::builtin();
        let msgs = vec![
            json!({"role":"system","content":"be brief"}),
            json!({"role":"user","content":"hi"}),
        ];
        let on = t
            .render(&msgs, true, &kw(json!({"enable_thinking": true})))
            .unwrap();
        assert_eq!(
            on,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        );
        let off = t
            .render(&msgs, true, &kw(json!({"enable_thinking": false})))
            .unwrap();
        assert!(
            off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{off}"
        );
        // Thinking is off unless asked for: a first request gets content, not only reasoning.
        let default = t.render(&msgs, true, &kw(json!({}))).unwrap();
        assert_eq!(default, off);
        let no_gen = t.render(&msgs, false, &kw(json!({}))).unwrap();
        assert!(no_gen.ends_with("hi<|im_end|>\n"));
        // List-of-parts content is flattened.
        let parts = vec![
            json!({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}),
        ];
        assert!(t
            .render(&parts, false, &kw(json!({})))
            .unwrap()
            .contains("a\nb"));
    }

    #[test]
    fn hf_template_with_pycompat_and_raise() {
        // A fragment in the style of Qwen3's template: Python string methods and namespace.
        let src = r#"{%- set ns = namespace(n=0) %}
{%- for message in messages %}
{%- if message.role not in ['user', 'assistant', 'system'] %}{{ raise_exception('bad role ' ~ message.role) }}{% endif %}
{%- set ns.n = ns.n + 1 %}
{{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"#;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            serde_json::to_string(&json!({"chat_template": src, "eos_token": "<|im_end|>"}))
                .unwrap(),
        )
        .unwrap();
        let t = ChatTemplate::from_dir(dir.path(), None, None)
            .unwrap()
            .unwrap();
        let out = t
            .render(
                &[json!({"role":"user","content":"  hi  "})],
                true,
                &kw(json!({"enable_thinking": false})),
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        let e = t
            .render(
                &[json!({"role":"tool","content":"x"})],
                true,
                &kw(json!({})),
            )
            .unwrap_err();
        assert!(e.contains("bad role tool"), "{e}");
    }

    #[test]
    fn template_file_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_dir(dir.path(), None, None)
            .unwrap()
            .is_none());
        std::fs::write(dir.path().join("tokenizer_config.json"), "{oops").unwrap();
        let e = ChatTemplate::from_dir(dir.path(), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("JSON"),
            "{e}"
        );
        std::fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
        let e = ChatTemplate::from_dir(dir.path(), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chat_template.jinja") && e.contains("compile"),
            "{e}"
        );
    }
}
