use super::*;

fn message(length: u32) -> Vec<u8> {
    let mut m = vec![0];
    m.extend_from_slice(&length.to_be_bytes());
    m.extend(std::iter::repeat_n(7u8, length as usize));
    m
}

/// An error that wraps another, as tonic's transport error does.
#[derive(Debug)]
struct Wrapped(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("transport error")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[test]
fn the_callers_deadline_is_told_from_a_dial_that_timed_out() {
    let deadline = Wrapped(Box::new(tonic::TimeoutExpired(())));
    assert!(caller_deadline_passed(&deadline));
    let dial = Wrapped(Box::new(tonic::ConnectError(Box::new(tonic::TimeoutExpired(())))));
    assert!(!caller_deadline_passed(&dial));
    let refused = Wrapped(Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
    assert!(!caller_deadline_passed(&refused));
}

#[test]
fn message_sizes_are_read_across_any_split_and_the_first_too_large_is_named() {
    let mut body = message(10);
    body.extend(message(0));
    body.extend(message(16));
    body.extend(message(17));
    for chunk in 1..body.len() {
        let mut sizes = MessageSizes::new(16);
        let outcome = body.chunks(chunk).try_for_each(|c| sizes.read(c));
        assert_eq!(outcome, Err(17), "chunks of {chunk}");
    }
    let mut sizes = MessageSizes::new(16);
    assert_eq!(sizes.read(&body[..body.len() - 22]), Ok(()));
}
