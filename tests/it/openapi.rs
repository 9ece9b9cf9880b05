//! `openapi.yaml` is the contract: the description generated from the handlers must equal the committed file.
//! After an intended API change, regenerate it with `JOINTSPACE_BLESS=1 cargo test --test it openapi::`.

#[test]
fn committed_openapi_matches_the_handlers() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let generated = jointspace::api::openapi::yaml();
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

/// Every operation the served document describes: its path, method and operation object.
fn operations() -> Vec<(String, String, serde_yaml::Value)> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&jointspace::api::openapi::yaml()).expect("the document parses");
    let mut ops = vec![];
    for (path, item) in doc["paths"].as_mapping().expect("paths") {
        for (method, op) in item.as_mapping().expect("a path item") {
            let name = |v: &serde_yaml::Value| v.as_str().expect("a name").to_string();
            ops.push((name(path), name(method), op.clone()));
        }
    }
    ops
}

/// OpenAPI requires every operationId to be unique (client generators name their methods by it).
#[test]
fn every_operation_id_is_unique() {
    let mut seen = std::collections::BTreeMap::new();
    for (path, method, op) in operations() {
        let Some(id) = op.get("operationId").and_then(|v| v.as_str()) else {
            panic!("{method} {path} has no operationId");
        };
        if let Some(other) = seen.insert(id.to_string(), (path.clone(), method.clone())) {
            panic!("operationId {id} names both {other:?} and {method} {path}");
        }
    }
    assert!(seen.len() >= 30, "{} operations", seen.len());
}

/// Every link leads to an operation that exists and sets only parameters that operation has.
#[test]
fn every_link_leads_to_a_real_operation_and_its_parameters() {
    let ops = operations();
    let params: std::collections::BTreeMap<&str, Vec<&str>> = ops
        .iter()
        .map(|(_, _, op)| {
            let names = op["parameters"]
                .as_sequence()
                .map(|ps| ps.iter().filter_map(|p| p["name"].as_str()).collect())
                .unwrap_or_default();
            (op["operationId"].as_str().expect("id"), names)
        })
        .collect();
    let mut links = 0;
    for (_, _, op) in &ops {
        let Some(responses) = op["responses"].as_mapping() else {
            continue;
        };
        for (_, r) in responses {
            for (name, link) in r["links"].as_mapping().into_iter().flatten() {
                links += 1;
                let target = link["operationId"].as_str().expect("operationId");
                let have = params
                    .get(target)
                    .unwrap_or_else(|| panic!("link {name:?} leads to no operation {target}"));
                for (p, _) in link["parameters"].as_mapping().expect("parameters") {
                    let p = p.as_str().expect("name");
                    assert!(
                        have.contains(&p),
                        "link {name:?}: {target} has no parameter {p}"
                    );
                }
            }
        }
    }
    assert!(links >= 10, "{links} links");
}
