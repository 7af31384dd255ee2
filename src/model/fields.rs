//! The one set of typed field readers of the `config.json` readers (`dense`, `hybrid`, `moe`): a
//! field absent or `null` is `None`, a field of the wrong type an error that names it (with its
//! path prefix, e.g. `text_config.`), so every family refuses bad input in the same words.

use serde_json::{Map, Value};

/// The fields of one JSON object, named in messages with the prefix `at` (`""` at the root,
/// `"text_config."` inside a wrapper).
#[derive(Clone, Copy)]
pub(super) struct Fields<'a> {
    /// The object read.
    pub(super) obj: &'a Map<String, Value>,
    /// Prefix of the field names in messages.
    pub(super) at: &'a str,
}

impl<'a> Fields<'a> {
    /// The fields of `obj`, named with the prefix `at`.
    pub(super) fn new(obj: &'a Map<String, Value>, at: &'a str) -> Self {
        Fields { obj, at }
    }

    /// A non-negative integer field.
    ///
    /// # Errors
    /// The field is present and not a non-negative integer.
    pub(super) fn uint(&self, key: &str) -> anyhow::Result<Option<usize>> {
        let at = self.at;
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) => Ok(Some(v as usize)),
                None => {
                    anyhow::bail!("field {at}{key}: expected a non-negative integer, found {n}")
                }
            },
            Some(other) => {
                anyhow::bail!("field {at}{key}: expected a non-negative integer, found {other}")
            }
        }
    }

    /// A boolean field.
    ///
    /// # Errors
    /// The field is present and not `true` or `false`.
    pub(super) fn boolean(&self, key: &str) -> anyhow::Result<Option<bool>> {
        let at = self.at;
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => anyhow::bail!("field {at}{key}: expected true or false, found {other}"),
        }
    }

    /// A positive integer field that must be present.
    ///
    /// # Errors
    /// The field is absent, 0, or not a non-negative integer.
    pub(super) fn need(&self, key: &str) -> anyhow::Result<usize> {
        let at = self.at;
        match self.uint(key)? {
            Some(0) => anyhow::bail!("field '{at}{key}' is 0"),
            Some(x) => Ok(x),
            None => anyhow::bail!("missing field '{at}{key}'"),
        }
    }
}

/// A number field of `obj` (any JSON object, e.g. a nested `rope_parameters`), named `{at}{key}`.
///
/// # Errors
/// The field is present and not a number.
pub(super) fn float(obj: &Map<String, Value>, key: &str, at: &str) -> anyhow::Result<Option<f64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => anyhow::bail!("field {at}{key}: expected a number, found {other}"),
    }
}
