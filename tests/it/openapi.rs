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
