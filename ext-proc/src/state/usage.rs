//! Token usage of one response, as the filter's `UsageScanner` read it from
//! the body and Envoy's access log delivered it (see `access_log`).

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptDetails {
    pub cached_tokens: u64,
}

impl Usage {
    /// `None` when the engine does not report it (vLLM only does with
    /// `--enable-prompt-tokens-details`): unknown, not zero.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.map(|d| d.cached_tokens)
    }
}
