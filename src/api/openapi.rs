//! The OpenAPI document: the handlers' own annotations, plus what the middleware adds to each operation,
//! read from the route table (keys, 401/403, 413/415, 429, 503).

use axum::http::Method;
use utoipa::{
    OpenApi,
    openapi::{
        Ref, RefOr, Required, ResponseBuilder,
        content::ContentBuilder,
        extensions::Extensions,
        header::HeaderBuilder,
        link::LinkBuilder,
        path::{Operation, ParameterBuilder, ParameterIn},
        schema::{ObjectBuilder, Type},
        security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme},
    },
};

use super::{
    access::{Access, RouteInfo},
    captions, collections, embed, error, images, page, routes, search, sync, system, upsert,
};

/// The served API description; `openapi.yaml` in the repository must be identical (a test checks it).
pub fn yaml() -> String {
    ApiDoc::openapi().to_yaml().unwrap_or_default()
}

#[derive(OpenApi)]
#[openapi(
    info(title = "jointspace", description = "Find photos from a sentence and sentences for a photo. Errors always have the shape of ErrorBody."),
    paths(
        collections::create, collections::list, collections::get, collections::delete, collections::export,
        sync::start, sync::get,
        images::add, images::list, images::get, images::delete, images::thumbnail,
        upsert::patch, upsert::get, upsert::put, upsert::delete,
        captions::add, captions::list, captions::delete,
        search::images, search::captions,
        embed::text, embed::image,
        page::index, page::file,
        system::healthz, system::readyz, system::metrics, system::openapi, system::bundle, system::reindex, system::snapshot,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail)),
    modifiers(&NoLicense, &Operational, &Links),
    tags((name = "collections"), (name = "images"), (name = "captions"), (name = "search"), (name = "embed"),
         (name = "system"), (name = "admin"), (name = "page"))
)]
pub struct ApiDoc;

/// utoipa fills `info.license` from Cargo.toml even when there is none; leave it out instead of empty.
struct NoLicense;

impl utoipa::Modify for NoLicense {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        openapi.info.license = None;
    }
}

/// Documents what the middleware adds to every operation: the API key (and its 401/403), the body limit
/// (413), the inference queue (429 with Retry-After) and the request timeout (503).
struct Operational;

impl utoipa::Modify for Operational {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer_scheme()));
        for (name, r) in shared_responses() {
            components
                .responses
                .insert(name.into(), RefOr::T(r.build()));
        }
        let routes = routes::infos(&routes::table());
        for (path, item) in openapi.paths.paths.iter_mut() {
            let ops: [(Method, &mut Option<Operation>); 5] = [
                (Method::GET, &mut item.get),
                (Method::POST, &mut item.post),
                (Method::PUT, &mut item.put),
                (Method::PATCH, &mut item.patch),
                (Method::DELETE, &mut item.delete),
            ];
            for (method, op) in ops {
                let Some(op) = op.as_mut() else { continue };
                let Some(route) = routes.get(&method, path) else {
                    continue;
                };
                if route.access == Access::Public {
                    continue;
                }
                document_keyed_operation(op, method, route);
            }
        }
    }
}

/// The API key scheme every keyed operation names.
fn bearer_scheme() -> Http {
    let mut bearer = Http::new(HttpAuthScheme::Bearer);
    bearer.description = Some(
        "`Authorization: Bearer <key>`. The admin key may do everything; the read key may GET, search \
         and embed. A server started without keys is open and ignores the header."
            .into(),
    );
    bearer
}

/// The middleware's answers, by the name operations refer to them with (`#/components/responses/<name>`).
fn shared_responses() -> [(&'static str, ResponseBuilder); 9] {
    let error = |description: &str| {
        ResponseBuilder::new().description(description).content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
    };
    let retry_after = HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::Integer))
        .description(Some("seconds to wait before retrying"))
        .build();
    [
        (
            "Unauthorized",
            error("no API key, or not a valid one (only when the server has keys configured)"),
        ),
        (
            "Forbidden",
            error(
                "the key's role does not allow this (read keys read; write keys also add and delete images and \
                 captions; admin keys also manage collections and the server), or the key may not use this \
                 collection",
            ),
        ),
        (
            "PayloadTooLarge",
            error(
                "the request body, or an image in it, is over the server's limit; the message states the limit",
            ),
        ),
        (
            "Overloaded",
            error("the key is over its request or row rate (code rate_limited), or the inference queue is full \
                   (code overloaded, in rows or in expected wait); retry after Retry-After seconds")
                .header("Retry-After", retry_after.clone()),
        ),
        (
            "Unavailable",
            error("the request ran past the server's timeout, or a dependency is unavailable")
                .header("Retry-After", retry_after),
        ),
        (
            "BadRequest",
            error(
                "the path, query or body cannot be parsed (e.g. an id that is not a 64-bit integer)",
            ),
        ),
        (
            "Invalid",
            error(
                "well-formed but not acceptable (e.g. a collection name outside the allowed pattern)",
            ),
        ),
        (
            "Conflict",
            error(
                "the write clashes with what is stored (a name or external id taken), or a request with the \
                 same Idempotency-Key is still running (code idempotency_in_flight; retry after Retry-After) \
                 or stopped without an answer when its server stopped (code idempotency_abandoned; it may \
                 have been applied: check, then send it with a new key)",
            ),
        ),
        (
            "UnsupportedMediaType",
            error(
                "the body's Content-Type is not one this operation reads; the message says which",
            ),
        ),
    ]
}

/// What the middleware adds to an operation behind a key: the collection name's rule, the key, and the
/// answers the middleware and extractors may give instead of the handler's.
fn document_keyed_operation(op: &mut Operation, method: Method, route: RouteInfo) {
    let shared = |name: &str| RefOr::Ref(Ref::new(format!("#/components/responses/{name}")));
    // The name rule of service::validate_collection_name, so clients (and fuzzers) can see it.
    for p in op.parameters.iter_mut().flatten() {
        if p.name == "collection" {
            p.schema = Some(RefOr::T(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[a-z0-9][a-z0-9_-]{0,63}$"))
                    .into(),
            ));
        }
    }
    let r = &mut op.responses.responses;
    op.security = Some(vec![SecurityRequirement::new(
        "bearer",
        Vec::<String>::new(),
    )]);
    r.insert("401".into(), shared("Unauthorized"));
    r.entry("503".into())
        .or_insert_with(|| shared("Unavailable"));
    r.insert("403".into(), shared("Forbidden"));
    // What the extractors answer for any operation: unparsable input, invalid names.
    r.entry("400".into())
        .or_insert_with(|| shared("BadRequest"));
    r.entry("422".into()).or_insert_with(|| shared("Invalid"));
    if matches!(method, Method::POST | Method::PUT | Method::PATCH) {
        r.entry("415".into())
            .or_insert_with(|| shared("UnsupportedMediaType"));
        r.entry("413".into())
            .or_insert_with(|| shared("PayloadTooLarge"));
    }
    if method == Method::POST && route.writes {
        op.parameters
            .get_or_insert_with(Vec::new)
            .push(idempotency_key_parameter());
        r.entry("409".into()).or_insert_with(|| shared("Conflict"));
    }
    // Any keyed route may meet its key's request rate; routes that run a model also the queue.
    r.insert("429".into(), shared("Overloaded"));
}

/// The `Idempotency-Key` header a writing POST takes.
fn idempotency_key_parameter() -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "any 1-255 visible ASCII characters (a UUID): a retry with the same key and \
             the same request gets the first successful answer again (with \
             `Idempotent-Replayed: true`) for 24 hours instead of running twice; 409 while \
             the first is still running or when its server stopped while running it, 422 \
             when the key was used for another request",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(255))
                .pattern(Some("^[!-~]+$")),
        ))
        .build()
}

/// OpenAPI links: where the ids a write answers with lead (a new collection's name to its images, an added
/// image's id to reading, patching and deleting it). Client tools follow them, and schemathesis' stateful
/// phase chains real ids through them instead of guessing.
struct Links;

/// A link: its name, the operation it leads to, and that operation's parameters as runtime expressions.
type Link = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const NAME: (&str, &str) = ("collection", "$response.body#/name");
const SAME: (&str, &str) = ("collection", "$request.path.collection");
const ADDED: (&str, &str) = ("id", "$response.body#/images/0/id");
const UPSERTED: (&str, &str) = ("id", "$response.body#/id");
const EXTERNAL: (&str, &str) = ("external_id", "$response.body#/external_id");

/// The links each answer (an operation and its status) carries.
const LINKS: &[(&str, &str, &[Link])] = &[
    (
        "create_collection",
        "201",
        &[
            ("GetCollection", "get_collection", &[NAME]),
            ("ListImages", "list_images", &[NAME]),
            ("AddImages", "add_images", &[NAME]),
            ("UpsertImage", "upsert_image", &[NAME]),
            ("SearchImages", "search_images", &[NAME]),
            ("ListCaptions", "list_captions", &[NAME]),
            ("AddCaptions", "add_captions", &[NAME]),
            ("SearchCaptions", "search_captions", &[NAME]),
            ("Export", "export_collection", &[NAME]),
            ("DeleteCollection", "delete_collection", &[NAME]),
        ],
    ),
    (
        "add_images",
        "201",
        &[
            ("GetImage", "get_image", &[SAME, ADDED]),
            ("Thumbnail", "thumbnail", &[SAME, ADDED]),
            ("PatchImage", "patch_image", &[SAME, ADDED]),
            ("DeleteImage", "delete_image", &[SAME, ADDED]),
            (
                "DeleteCaption",
                "delete_caption",
                &[SAME, ("id", "$response.body#/images/0/caption_ids/0")],
            ),
        ],
    ),
    (
        "add_captions",
        "201",
        &[(
            "DeleteCaption",
            "delete_caption",
            &[SAME, ("id", "$response.body#/ids/0")],
        )],
    ),
    (
        "upsert_image",
        "201",
        &[
            ("GetImage", "get_image", &[SAME, UPSERTED]),
            (
                "GetByExternalId",
                "get_image_by_external_id",
                &[SAME, EXTERNAL],
            ),
            (
                "DeleteByExternalId",
                "delete_image_by_external_id",
                &[SAME, EXTERNAL],
            ),
        ],
    ),
    (
        "upsert_image",
        "200",
        &[("GetImage", "get_image", &[SAME, UPSERTED])],
    ),
];

impl utoipa::Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                let Some(id) = op.operation_id.clone() else {
                    continue;
                };
                for (_, status, links) in LINKS.iter().filter(|l| l.0 == id) {
                    let Some(RefOr::T(response)) = op.responses.responses.get_mut(*status) else {
                        panic!("links need operation {id} to answer {status} itself");
                    };
                    for (name, target, params) in *links {
                        // utoipa 5.5 writes `Link::operation_id` as "operation_id"; OpenAPI's name is
                        // "operationId", so it goes in through the flattened extensions map instead.
                        let target = Extensions::from_iter([("operationId", *target)]);
                        let link = params.iter().fold(
                            LinkBuilder::new().extensions(Some(target)),
                            |l, (p, expr)| l.parameter(*p, *expr),
                        );
                        response
                            .links
                            .insert((*name).to_string(), link.build().into());
                    }
                }
            }
        }
    }
}
