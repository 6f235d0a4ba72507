//! The parts of an OpenAI-style request body that routing needs, borrowed from
//! the body where possible. Unknown fields are skipped, never rejected.

use std::borrow::Cow;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct Request<'a> {
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub messages: Option<Vec<Message<'a>>>,
    #[serde(borrow)]
    pub prompt: Option<Prompt<'a>>,
    #[serde(borrow)]
    pub prompt_cache_key: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub user: Option<Cow<'a, str>>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    #[serde(borrow)]
    pub role: Cow<'a, str>,
    #[serde(borrow, default)]
    pub content: Option<Content<'a>>,
}

/// A message's content: a string, or an array of typed parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content<'a> {
    #[serde(borrow)]
    Text(Cow<'a, str>),
    #[serde(borrow)]
    Parts(Vec<Part<'a>>),
}

#[derive(Debug, Deserialize)]
pub struct Part<'a> {
    #[serde(borrow, rename = "type")]
    pub kind: Cow<'a, str>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
}

/// A completions prompt: a string or an array of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt<'a> {
    #[serde(borrow)]
    Text(Cow<'a, str>),
    #[serde(borrow)]
    Many(Vec<Cow<'a, str>>),
}

/// Only the model, for bodies whose other fields have the wrong shape.
#[derive(Debug, Deserialize)]
pub struct ModelOnly<'a> {
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
}
