//! Reading the fields crius uses from an OCI image config JSON.

use serde_json::Value;

use super::error::{Result, SpecError};

/// The execution parameters of an image: the `config` object of an OCI image config, or that
/// object itself when given directly.
pub(crate) struct ImageConfig<'a> {
    config: Option<&'a serde_json::Map<String, Value>>,
}

impl<'a> ImageConfig<'a> {
    pub(crate) fn new(value: &'a Value) -> Self {
        let config = match value.get("config") {
            Some(Value::Object(c)) => Some(c),
            Some(_) => None,
            None => value.as_object().filter(|o| {
                [
                    "Env",
                    "Cmd",
                    "Entrypoint",
                    "WorkingDir",
                    "User",
                    "StopSignal",
                ]
                .iter()
                .any(|k| o.contains_key(*k))
            }),
        };
        ImageConfig { config }
    }

    fn str_field(&self, key: &str) -> Option<&'a str> {
        self.config?.get(key)?.as_str()
    }

    /// A list of strings; JSON `null` or absent is `None`, an explicit `[]` is `Some([])`.
    fn list(&self, key: &str) -> Result<Option<Vec<String>>> {
        let Some(v) = self.config.and_then(|c| c.get(key)) else {
            return Ok(None);
        };
        match v {
            Value::Null => Ok(None),
            Value::Array(items) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_string).ok_or_else(|| {
                        SpecError::invalid(format!("image config {key} holds a non-string"))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            _ => Err(SpecError::invalid(format!(
                "image config {key} is not a list of strings"
            ))),
        }
    }

    pub(crate) fn env(&self) -> Result<Vec<String>> {
        Ok(self.list("Env")?.unwrap_or_default())
    }

    pub(crate) fn entrypoint(&self) -> Result<Option<Vec<String>>> {
        self.list("Entrypoint")
    }

    pub(crate) fn cmd(&self) -> Result<Vec<String>> {
        Ok(self.list("Cmd")?.unwrap_or_default())
    }

    pub(crate) fn working_dir(&self) -> &'a str {
        self.str_field("WorkingDir").unwrap_or("")
    }

    pub(crate) fn user(&self) -> &'a str {
        self.str_field("User").unwrap_or("")
    }

    pub(crate) fn stop_signal(&self) -> Option<&'a str> {
        self.str_field("StopSignal")
    }
}
