//! What a listing asks for beyond a kind and a state: a name prefix and an
//! attribute selector in the Kubernetes label-selector grammar, parsed once
//! and matched against each stored resource by the region that owns it.
//!
//! The grammar (as `kubectl get -l` takes it), requirements joined by
//! commas, all of which must hold:
//!
//! | requirement     | holds when the resource's attributes …            |
//! |-----------------|---------------------------------------------------|
//! | `k=v`, `k==v`   | have `k` equal to `v`                             |
//! | `k!=v`          | do not have `k` equal to `v` (absent `k` holds)   |
//! | `k in (a,b)`    | have `k` equal to one of the values               |
//! | `k notin (a,b)` | do not have `k` equal to any (absent `k` holds)   |
//! | `k`             | have `k`                                          |
//! | `!k`            | do not have `k`                                   |
//!
//! Keys and values are made of ASCII letters, digits and `-_./`; a value
//! may be empty (`k=`). Spaces around tokens are allowed. A selector that
//! does not parse is refused with the position (in characters from 0) and a
//! short quote of what follows it, so a person sees where it went wrong.

use std::collections::BTreeMap;
use std::fmt;

use crate::limits::quote;
pub use crate::limits::MAX_SELECTOR_BYTES;

/// Requirements one selector may hold.
pub const MAX_SELECTOR_REQUIREMENTS: usize = 32;
/// Values of one `in` or `notin` set.
pub const MAX_SELECTOR_VALUES: usize = 64;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `k=v` or `k==v`.
    Equals(String, String),
    /// `k!=v`.
    NotEquals(String, String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)`.
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    DoesNotExist(String),
}

impl Requirement {
    /// Whether a resource with these attributes meets it.
    pub fn matches(&self, attributes: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => attributes.get(k) == Some(v),
            Requirement::NotEquals(k, v) => attributes.get(k) != Some(v),
            Requirement::In(k, vs) => attributes.get(k).is_some_and(|a| vs.contains(a)),
            Requirement::NotIn(k, vs) => attributes.get(k).is_none_or(|a| !vs.contains(a)),
            Requirement::Exists(k) => attributes.contains_key(k),
            Requirement::DoesNotExist(k) => !attributes.contains_key(k),
        }
    }
}

/// A parsed attribute selector: every requirement must hold. The empty
/// selector holds for every resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// The requirements, in the order written.
    pub requirements: Vec<Requirement>,
}

impl Selector {
    /// Parses the Kubernetes label-selector grammar (module doc).
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > MAX_SELECTOR_BYTES {
            return Err(SelectorError {
                position: 0,
                expected: "a shorter selector",
                found: format!("{} bytes (at most {MAX_SELECTOR_BYTES})", text.len()),
            });
        }
        let mut parser = Parser {
            chars: text.chars().collect(),
            at: 0,
        };
        let mut requirements = Vec::new();
        parser.skip_spaces();
        if parser.at_end() {
            return Ok(Selector::default());
        }
        loop {
            if requirements.len() == MAX_SELECTOR_REQUIREMENTS {
                return Err(parser.error("at most 32 requirements"));
            }
            requirements.push(parser.requirement()?);
            parser.skip_spaces();
            if parser.at_end() {
                return Ok(Selector { requirements });
            }
            if !parser.eat(',') {
                return Err(parser.error("',' or the end"));
            }
        }
    }

    /// Whether a resource with these attributes meets every requirement.
    pub fn matches(&self, attributes: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(attributes))
    }

    /// Whether it holds for every resource (no requirement).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// A selector that does not parse: where, what was expected, and a short
/// quote of what was found there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attribute selector: at character {position}: expected {expected}, found {found}")]
pub struct SelectorError {
    /// Characters from the start of the selector.
    pub position: usize,
    /// What the grammar allows there.
    pub expected: &'static str,
    /// What is there, quoted ([`quote`]: a short prefix), or "the end".
    pub found: String,
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

impl Parser {
    fn at_end(&self) -> bool {
        self.at >= self.chars.len()
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn error(&self, expected: &'static str) -> SelectorError {
        let rest: String = self.chars[self.at.min(self.chars.len())..].iter().collect();
        SelectorError {
            position: self.at,
            expected,
            found: if rest.is_empty() {
                "the end".to_owned()
            } else {
                quote(&rest)
            },
        }
    }

    fn word(&mut self) -> String {
        let start = self.at;
        while self.peek().is_some_and(is_word_char) {
            self.at += 1;
        }
        self.chars[start..self.at].iter().collect()
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        self.skip_spaces();
        let key = self.word();
        if key.is_empty() {
            return Err(self.error("an attribute key"));
        }
        Ok(key)
    }

    fn value(&mut self) -> String {
        self.skip_spaces();
        self.word()
    }

    /// `(a, b)` after `in` or `notin`.
    fn set(&mut self) -> Result<Vec<String>, SelectorError> {
        self.skip_spaces();
        if !self.eat('(') {
            return Err(self.error("'(' and a set of values"));
        }
        let mut values = Vec::new();
        loop {
            if values.len() == MAX_SELECTOR_VALUES {
                return Err(self.error("at most 64 values in a set"));
            }
            let value = self.value();
            self.skip_spaces();
            // Kubernetes refuses an empty set (`in ()`): it would select
            // by the empty value, or, with notin, almost everything.
            if value.is_empty() && values.is_empty() && self.peek() == Some(')') {
                return Err(self.error("a value in the set"));
            }
            values.push(value);
            if self.eat(')') {
                return Ok(values);
            }
            if !self.eat(',') {
                return Err(self.error("',' or ')'"));
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        self.skip_spaces();
        if self.eat('!') {
            return Ok(Requirement::DoesNotExist(self.key()?));
        }
        let key = self.key()?;
        let before_operator = self.at;
        self.skip_spaces();
        if self.eat('=') {
            self.eat('=');
            return Ok(Requirement::Equals(key, self.value()));
        }
        if self.eat('!') {
            if !self.eat('=') {
                return Err(self.error("'=' after '!'"));
            }
            return Ok(Requirement::NotEquals(key, self.value()));
        }
        // `in` and `notin` need a space after the key; a bare key ends at
        // a comma or the end.
        let spaced = self.at > before_operator;
        let word_at = self.at;
        let word = self.word();
        match word.as_str() {
            "in" if spaced => Ok(Requirement::In(key, self.set()?)),
            "notin" if spaced => Ok(Requirement::NotIn(key, self.set()?)),
            "" if self.peek().is_none_or(|c| c == ',' || c.is_whitespace()) => Ok(Requirement::Exists(key)),
            _ => {
                self.at = word_at;
                Err(self.error("'=', '==', '!=', 'in', 'notin', ',' or the end"))
            }
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn holds(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector)
            .unwrap_or_else(|e| panic!("{selector}: {e}"))
            .matches(&attrs(pairs))
    }

    #[test]
    fn every_form_of_the_grammar_parses_and_matches_as_kubernetes_does() {
        let staging = [("env", "staging"), ("tier", "web")];
        let db = [("env", "staging"), ("tier", "db")];
        let bare: [(&str, &str); 0] = [];
        assert!(holds("env=staging", &staging));
        assert!(holds("env==staging", &staging));
        assert!(!holds("env=prod", &staging));
        assert!(holds("env=staging,tier!=db", &staging));
        assert!(!holds("env=staging,tier!=db", &db));
        // `!=` and `notin` hold for a resource without the key.
        assert!(holds("tier!=db", &bare));
        assert!(holds("tier notin (db, cache)", &bare));
        assert!(!holds("tier notin (db,cache)", &db));
        assert!(holds("tier in (web,db)", &db));
        assert!(!holds("tier in (web)", &bare));
        assert!(holds("tier", &db));
        assert!(!holds("tier", &bare));
        assert!(holds("!tier", &bare));
        assert!(!holds("!tier", &db));
        assert!(holds(" env = staging , tier ", &staging));
        assert!(holds("", &bare));
        assert!(holds("empty=", &[("empty", "")]));
        assert!(holds("app.example.com/name=x", &[("app.example.com/name", "x")]));
    }

    #[test]
    fn a_bad_selector_names_the_position_and_quotes_a_short_prefix() {
        let e = Selector::parse("env=staging,tier~db").unwrap_err();
        assert_eq!(e.position, 16, "{e}");
        assert_eq!(
            e.to_string(),
            "attribute selector: at character 16: expected '=', '==', '!=', 'in', 'notin', ',' or the end, found \"~db\""
        );
        let e = Selector::parse("env=staging,").unwrap_err();
        assert_eq!((e.position, e.found.as_str()), (12, "the end"));
        let e = Selector::parse("tier in db").unwrap_err();
        assert_eq!(e.expected, "'(' and a set of values");
        for empty in ["tier in ()", "tier notin ( )"] {
            let e = Selector::parse(empty).unwrap_err();
            assert_eq!(e.expected, "a value in the set", "{empty}");
        }
        let e = Selector::parse("tier in (a,b").unwrap_err();
        assert_eq!(e.expected, "',' or ')'");
        let e = Selector::parse("tier ! db").unwrap_err();
        assert_eq!(e.expected, "'=' after '!'");
        // A long tail is quoted by its first characters and its length.
        let long = format!("env=x,{}", "~".repeat(900));
        let e = Selector::parse(&long).unwrap_err().to_string();
        assert!(e.contains("(900 bytes)") && e.len() < 250, "{e}");
        let e = Selector::parse(&"a".repeat(MAX_SELECTOR_BYTES + 1)).unwrap_err();
        assert_eq!(e.expected, "a shorter selector");
        let many = vec!["k"; MAX_SELECTOR_REQUIREMENTS + 1].join(",");
        assert_eq!(Selector::parse(&many).unwrap_err().expected, "at most 32 requirements");
    }

    fn word() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9._-]{0,6}"
    }

    fn requirement() -> impl Strategy<Value = Requirement> {
        prop_oneof![
            (word(), word()).prop_map(|(k, v)| Requirement::Equals(k, v)),
            (word(), word()).prop_map(|(k, v)| Requirement::NotEquals(k, v)),
            (word(), prop::collection::vec(word(), 1..4)).prop_map(|(k, v)| Requirement::In(k, v)),
            (word(), prop::collection::vec(word(), 1..4)).prop_map(|(k, v)| Requirement::NotIn(k, v)),
            word().prop_map(Requirement::Exists),
            word().prop_map(Requirement::DoesNotExist),
        ]
    }

    proptest! {
        /// What `Display` writes parses back to the same selector, and
        /// arbitrary text never panics the parser.
        #[test]
        fn a_written_selector_parses_back(reqs in prop::collection::vec(requirement(), 0..8), junk in ".{0,40}") {
            let selector = Selector { requirements: reqs };
            prop_assert_eq!(Selector::parse(&selector.to_string()), Ok(selector));
            let _ = Selector::parse(&junk);
        }
    }
}
