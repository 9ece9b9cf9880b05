//! `openapi.yaml` is the contract: the description generated from the handlers must equal the committed file.
//! After an intended API change, regenerate it with `JOINTSPACE_BLESS=1 cargo test --test it openapi::`.

#[test]
fn committed_openapi_matches_the_handlers() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let generated = jointspace::api::system::openapi_yaml();
    if std::env::var_os("JOINTSPACE_BLESS").is_some() {
        std::fs::write(path, &generated).expect("write openapi.yaml");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi.yaml differs from the API the server serves; if the change is intended, run \
         `JOINTSPACE_BLESS=1 cargo test --test it openapi::` and commit openapi.yaml"
    );
}

/// OpenAPI requires every operationId to be unique (client generators name their methods by it).
#[test]
fn every_operation_id_is_unique() {
    let doc: serde_yaml::Value = serde_yaml::from_str(&jointspace::api::system::openapi_yaml())
        .expect("the document parses");
    let mut seen = std::collections::BTreeMap::new();
    for (path, item) in doc["paths"].as_mapping().expect("paths") {
        for (method, op) in item.as_mapping().expect("a path item") {
            let Some(id) = op.get("operationId").and_then(|v| v.as_str()) else {
                panic!("{path:?} {method:?} has no operationId");
            };
            if let Some(other) = seen.insert(id.to_string(), (path.clone(), method.clone())) {
                panic!("operationId {id} names both {other:?} and {path:?} {method:?}");
            }
        }
    }
    assert!(seen.len() >= 30, "{} operations", seen.len());
}
