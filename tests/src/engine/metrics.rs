//! Prometheus text under vLLM's metric names, so whatever scrapes real engines
//! can scrape the simulated ones unchanged.

use std::fmt::Write;

use super::replica::Snapshot;

/// The exposition text of one replica.
pub fn render(s: &Snapshot) -> String {
    let usage = if s.cache_capacity_tokens == 0 {
        0.0
    } else {
        s.cache_used_tokens as f64 / s.cache_capacity_tokens as f64
    };
    let series: [(&str, &str, &str, f64); 8] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Requests in the running batch.",
            s.running as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting for a batch slot.",
            s.waiting as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "Prefix cache usage, 1 = full.",
            usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            s.prompt_tokens as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            s.cached_tokens as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            s.prompt_tokens as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            s.generation_tokens as f64,
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Requests completed.",
            s.requests_served as f64,
        ),
    ];
    let label = escape(&s.model);
    let mut out = String::new();
    for (name, kind, help, value) in series {
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{label}\"}} {value}"
        );
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::faults::Fault;

    #[test]
    fn exposition() {
        let s = Snapshot {
            name: "r1".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            model: "m\"1".into(),
            fault: Fault::default(),
            requests_served: 3,
            running: 1,
            waiting: 2,
            cache_used_tokens: 256,
            cache_capacity_tokens: 1024,
            prompt_tokens: 900,
            cached_tokens: 512,
            generation_tokens: 48,
            authorization: Default::default(),
        };
        let text = render(&s);
        assert!(text.contains("# TYPE vllm:num_requests_waiting gauge\n"));
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"m\\\"1\"} 2\n"));
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"1\"} 0.25\n"));
        assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"m\\\"1\"} 512\n"));
        assert!(text.contains("vllm:request_success_total{model_name=\"m\\\"1\"} 3\n"));
    }
}
