//! Fuzzing the request decoders: arbitrary bytes decoded as every request
//! a node accepts (prost), then through the conversions into the core's
//! terms. Nothing may panic; a refusal is INVALID_ARGUMENT naming a field.
//! `PROPTEST_CASES` sets the cases per property for a deeper run.

use cascade_proto::{convert, v1};
use proptest::prelude::*;
use prost::Message;

fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn refused_with_a_field(status: &tonic::Status) -> Result<(), TestCaseError> {
    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument, "{:?}", status);
    prop_assert!(!status.message().is_empty());
    Ok(())
}

/// Decodes `bytes` as every request type and converts what decodes.
fn decode_everything(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(req) = v1::CreateRequest::decode(bytes) {
        if let Some(spec) = req.resource {
            if let Err(e) = convert::resource_spec(spec, "resource") {
                refused_with_a_field(&e)?;
            }
        }
    }
    if let Ok(req) = v1::BatchCreateRequest::decode(bytes) {
        for (i, spec) in req.resources.into_iter().enumerate() {
            if let Err(e) = convert::resource_spec(spec, &format!("resources[{i}]")) {
                refused_with_a_field(&e)?;
            }
        }
    }
    if let Ok(req) = v1::DeleteRequest::decode(bytes) {
        if let Err(e) = convert::delete_request(req) {
            refused_with_a_field(&e)?;
        }
    }
    if let Ok(req) = v1::AttachRequest::decode(bytes) {
        for (i, b) in req.backrefs.into_iter().enumerate() {
            if let Err(e) = convert::peer_backref_from(b, &format!("backrefs[{i}]")) {
                refused_with_a_field(&e)?;
            }
        }
    }
    if let Ok(req) = v1::ReleaseRequest::decode(bytes) {
        for (i, b) in req.backrefs.into_iter().enumerate() {
            if let Err(e) = convert::peer_backref_from(b, &format!("backrefs[{i}]")) {
                refused_with_a_field(&e)?;
            }
        }
    }
    if let Ok(req) = v1::PeerPlanRequest::decode(bytes) {
        for s in req.seeds {
            if let Err(e) = convert::ref_target(Some(s), "seeds") {
                refused_with_a_field(&e)?;
            }
        }
    }
    if let Ok(plan) = v1::Plan::decode(bytes) {
        if let Err(e) = convert::plan_from(plan) {
            refused_with_a_field(&e)?;
        }
    }
    if let Ok(event) = v1::PeerEvent::decode(bytes) {
        // An unknown event type is None (ignored by the link), never a panic.
        let _ = convert::event_type_from(event.r#type);
        if let Some(r) = event.resource {
            if let Err(e) = convert::ref_target(Some(r), "resource") {
                refused_with_a_field(&e)?;
            }
        }
    }
    Ok(())
}

/// Valid-looking messages with hostile field values: what arbitrary bytes
/// rarely reach (names, uids and fields that almost parse).
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "[a-z]{1,8}/[a-z_]{1,12}/[a-z0-9-]{0,12}",
        "[0-9a-f-]{30,40}",
        Just(String::new()),
        Just("eu-west/port/../../x".to_owned()),
    ]
}

fn hostile_ref() -> impl Strategy<Value = v1::ObjectRef> {
    (hostile_text(), hostile_text(), any::<bool>()).prop_map(|(name, uid, dangling)| v1::ObjectRef {
        name,
        uid,
        dangling,
    })
}

fn hostile_spec() -> impl Strategy<Value = v1::ResourceSpec> {
    (
        hostile_text(),
        prop::collection::hash_map(hostile_text(), hostile_text(), 0..4),
        prop::collection::vec((hostile_text(), prop::collection::vec(hostile_ref(), 0..3)), 0..4),
        prop::collection::vec(hostile_text(), 0..3),
    )
        .prop_map(|(name, attributes, refs, finalizers)| v1::ResourceSpec {
            name,
            attributes,
            refs: refs
                .into_iter()
                .map(|(field, targets)| v1::ReferenceField { field, targets })
                .collect(),
            finalizers,
        })
}

proptest! {
    #![proptest_config(config(2_000))]

    #[test]
    fn arbitrary_bytes_decode_and_convert_or_refuse(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_everything(&bytes)?;
    }

    #[test]
    fn hostile_specs_convert_or_name_the_field(spec in hostile_spec()) {
        // Through the wire and back, as a node receives it.
        let bytes = v1::CreateRequest { resource: Some(spec) }.encode_to_vec();
        decode_everything(&bytes)?;
    }

    #[test]
    fn hostile_backrefs_convert_or_name_the_field(
        refs in prop::collection::vec((prop::option::of(hostile_ref()), prop::option::of(hostile_ref()), hostile_text(), any::<u64>()), 0..6)
    ) {
        let backrefs = refs
            .into_iter()
            .map(|(target, referrer, field, generation)| v1::PeerBackRef { target, referrer, field, generation, ..Default::default() })
            .collect();
        let bytes = v1::ReleaseRequest { from_region: "rb".into(), backrefs }.encode_to_vec();
        decode_everything(&bytes)?;
    }
}
