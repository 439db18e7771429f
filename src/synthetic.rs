//! Deterministic, realistic agent transcripts for tests, benchmarks, examples and the
//! compression study: chat messages, tool calls with JSON arguments, JSON tool outputs and
//! key/value state changes, as an LLM agent produces them. Not part of the stable API.

use crate::codec::proto::{ChatMessage, Delta, IntermediateResult, StateChange, ToolCall, ToolOutput, state_change};

const WORDS: &[&str] = &[
    "the",
    "user",
    "wants",
    "to",
    "find",
    "a",
    "flight",
    "from",
    "paris",
    "berlin",
    "next",
    "week",
    "I",
    "should",
    "check",
    "availability",
    "and",
    "compare",
    "prices",
    "before",
    "booking",
    "results",
    "show",
    "three",
    "options",
    "cheapest",
    "is",
    "with",
    "layover",
    "in",
    "frankfurt",
    "direct",
    "costs",
    "more",
    "but",
    "saves",
    "time",
    "let",
    "me",
    "summarize",
    "findings",
    "for",
    "report",
    "draft",
    "section",
    "analysis",
    "data",
    "table",
    "query",
    "file",
    "error",
    "retry",
    "approved",
    "pending",
    "review",
    "budget",
    "hotel",
    "near",
    "station",
    "meeting",
    "agenda",
];
const TOOLS: &[&str] = &["web_search", "read_file", "run_sql", "http_get", "calendar_lookup", "send_email"];
const ROLES: &[&str] = &["assistant", "tool", "user"];

/// SplitMix64: a tiny seedable PRNG, so that every simulated crash, transcript and fault
/// schedule replays from one number.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A seeded generator of agent deltas (the same seed gives the same transcript).
#[derive(Debug, Clone)]
pub struct Transcript {
    rng: SplitMix64,
    step: u64,
}

impl Transcript {
    /// A transcript generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { rng: SplitMix64::new(seed ^ 0x9e37_79b9_7f4a_7c15), step: 0 }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    fn sentence(&mut self, words: u64) -> String {
        let count = words / 2 + self.below(words);
        let mut text = String::new();
        for i in 0..count {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(WORDS[self.below(WORDS.len() as u64) as usize]);
        }
        text.push('.');
        text
    }

    /// The next delta: about `bytes` bytes of messages, tool traffic and state changes.
    pub fn next_delta(&mut self, bytes: usize) -> Delta {
        self.step += 1;
        let step = self.step;
        let tool = TOOLS[self.below(TOOLS.len() as u64) as usize];
        let call_id = format!("call_{step:06}_{:04x}", self.below(0xffff));
        let words = (bytes / 12).max(4) as u64;
        let thought = self.sentence(words / 2);
        let arguments =
            format!(r#"{{"query": "{}", "limit": {}, "page": {}}}"#, self.sentence(6), 5 + self.below(20), step % 7);
        let output = format!(
            r#"{{"status": "ok", "step": {step}, "items": [{{"title": "{}", "score": 0.{}}}, {{"title": "{}", "score": 0.{}}}]}}"#,
            self.sentence(words / 6),
            self.below(1000),
            self.sentence(words / 6),
            self.below(1000)
        );
        let role = ROLES[self.below(ROLES.len() as u64) as usize].to_owned();
        Delta {
            messages: vec![ChatMessage {
                role,
                content: thought,
                tool_call: Some(ToolCall { id: call_id.clone(), name: tool.to_owned(), arguments }),
            }],
            tool_outputs: vec![ToolOutput { tool_call_id: call_id, output: output.into_bytes() }],
            intermediate_results: vec![IntermediateResult {
                name: format!("step-{step}.summary"),
                value: self.sentence(6).into_bytes(),
            }],
            state_changes: vec![
                StateChange {
                    key: format!("memory.facts.{}", self.below(4000)),
                    change: Some(state_change::Change::Set(self.sentence(5).into_bytes())),
                },
                StateChange {
                    key: "plan.current_step".to_owned(),
                    change: Some(state_change::Change::Set(step.to_string().into_bytes())),
                },
            ],
            ..Delta::default()
        }
    }
}
