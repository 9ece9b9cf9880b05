//! What a feed asks of a collection before anything is written: the settings it is written under, each
//! product's photos as the items the collection holds, and the withdrawals, refused as a whole when they are
//! more of the collection than the caller allows (a feed cut short must not wipe a catalogue).

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::{Catalogue, FeedItem, FeedPhoto};
use crate::{
    CollectionName, Result, Service, ServiceError, filter::FieldPath, store::CollectionSettings,
};

impl Service {
    /// The settings a sync writes under: the collection's, or for a collection not there yet those of
    /// `create` (None: a missing collection is an error). A `create.group_by` that differs from an existing
    /// collection's is refused: the feed's photos would be grouped one way and searched another.
    pub(crate) async fn feed_settings(
        &self,
        collection: &CollectionName,
        create: Option<&CollectionSettings>,
    ) -> Result<CollectionSettings> {
        match self.collection(collection).await {
            Ok(c) => {
                if let Some(asked) = create.and_then(|s| s.group_by.as_ref())
                    && Some(asked) != c.group_by.as_ref()
                {
                    return Err(ServiceError::Invalid(format!(
                        "--group-by {asked} but \"{collection}\" groups by {}: a collection's product key \
                         is set when it is created",
                        c.group_by.as_deref().unwrap_or("nothing")
                    )));
                }
                Ok(CollectionSettings {
                    text_fields: c.text_fields,
                    group_by: c.group_by,
                })
            }
            Err(ServiceError::NoCollection(_)) if create.is_some() => {
                Ok(create.cloned().unwrap_or_default())
            }
            Err(e) => Err(e),
        }
    }
}

/// Each product's photos as items of their own, as the collection holds them: the first under the product's
/// id, the n-th under `<id>~<n>`, each with the product's key in the `group_by` field (unless the feed gives
/// it) and its attributes, so filters and grouped search see every photo as the product's. The product's
/// captions and text fields go with its first photo only: a product's words are embedded once, and its other
/// photos reach them through the group (`search::groups`).
pub fn by_photo(products: Vec<FeedItem>, settings: &CollectionSettings) -> Result<Vec<FeedItem>> {
    let text_fields: Vec<FieldPath> = settings
        .text_fields
        .iter()
        .flatten()
        .filter_map(|f| FieldPath::parse(&f.path).ok())
        .collect();
    let key = match &settings.group_by {
        Some(k) => Some(FieldPath::parse(k).map_err(|e| ServiceError::Invalid(e.to_string()))?),
        None => None,
    };
    let mut items = Vec::with_capacity(products.len());
    for mut p in products {
        if let Some(path) = &key {
            if path.get(&p.metadata).is_none() {
                set_path(&mut p.metadata, path, Value::String(p.external_id.clone()));
            }
        } else if p.photos.len() > 1 {
            return Err(ServiceError::Invalid(format!(
                "line {}: item {:?} has {} photos; a collection holds several photos of a product when it \
                 groups them by a product key (create it with --create --group-by product_id)",
                p.line,
                p.external_id,
                p.photos.len()
            )));
        }
        let mut rest = p.metadata.clone();
        for f in &text_fields {
            remove_path(&mut rest, f);
        }
        let others: Vec<FeedPhoto> = p.photos.drain(1..).collect();
        let (line, id) = (p.line, p.external_id.clone());
        items.push(p);
        for (n, photo) in others.into_iter().enumerate() {
            items.push(FeedItem {
                line,
                external_id: format!("{id}~{}", n + 2),
                photos: vec![photo],
                metadata: rest.clone(),
                captions: vec![],
            });
        }
    }
    let mut seen = HashSet::new();
    for it in &items {
        if !seen.insert(&it.external_id) {
            return Err(ServiceError::Invalid(format!(
                "line {}: the id {:?} is another item's photo (`<id>~<n>` names a product's n-th photo): \
                 nothing was written",
                it.line, it.external_id
            )));
        }
    }
    Ok(items)
}

/// The stored items the feed leaves out, as (external id, image id) in id order; refused (with why, and the
/// share that would pass) when they are more than `max_share` of the items held under external ids.
pub fn withdrawals<'a>(
    catalogue: &'a Catalogue,
    items: &[FeedItem],
    max_share: f64,
    collection: &CollectionName,
) -> std::result::Result<Vec<(&'a String, i64)>, String> {
    let in_feed: HashSet<&str> = items.iter().map(|i| i.external_id.as_str()).collect();
    let mut gone: Vec<(&String, i64)> = catalogue
        .items
        .iter()
        .filter(|(e, _)| !in_feed.contains(e.as_str()))
        .map(|(e, s)| (e, s.id))
        .collect();
    gone.sort_by_key(|(_, id)| *id);
    let held = catalogue.items.len();
    let share = gone.len() as f64 / held.max(1) as f64;
    if share > max_share {
        return Err(format!(
            "the feed leaves out {} of the {held} items \"{collection}\" holds under external ids ({:.1}%), \
             more than --max-delete-share {max_share} allows: nothing was written. A feed cut short would \
             wipe the catalogue; if these items are withdrawn indeed, run again with --max-delete-share \
             {:.2} or more",
            gone.len(),
            share * 100.0,
            // Rounded up from whole numbers: 0.4 * 100.0 is 40.00000000000001 in floating point.
            ((gone.len() * 100) as f64 / held as f64).ceil() / 100.0,
        ));
    }
    Ok(gone)
}

/// Sets the value at a dotted path, making the objects on the way.
fn set_path(v: &mut Value, path: &FieldPath, x: Value) {
    let (last, parents) = path.segments().split_last().expect("a path has a segment");
    let mut at = v;
    for s in parents {
        if !at.get(s).is_some_and(Value::is_object) {
            at[s.as_str()] = Value::Object(Map::new());
        }
        at = &mut at[s.as_str()];
    }
    at[last.as_str()] = x;
}

/// Removes the value at a dotted path, if there is one.
fn remove_path(v: &mut Value, path: &FieldPath) {
    let (last, parents) = path.segments().split_last().expect("a path has a segment");
    let at = parents.iter().try_fold(v, |at, s| at.get_mut(s.as_str()));
    if let Some(Value::Object(m)) = at {
        m.remove(last.as_str());
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::items::feed::{FeedFormat, FeedMapping, FeedSource, read_feed};

    #[test]
    fn a_product_with_several_photos_is_an_item_per_photo() {
        let source = FeedSource {
            name: Some("feed.csv"),
            dir: Some(Path::new("/feeds")),
        };
        let feed = "id,image,name,brand,price\np1,front.jpg | back.jpg|worn.jpg,Red shoe,acme,40\n";
        let m = FeedMapping::new(FeedFormat::Csv);
        let product = read_feed(feed.as_bytes(), &m, &source)
            .expect("feed")
            .remove(0);
        assert_eq!(product.photos.len(), 3);
        let settings = CollectionSettings {
            text_fields: Some(vec![crate::TextField::new("name")]),
            group_by: Some("product.id".into()),
        };
        let items = by_photo(vec![product.clone()], &settings).expect("photos");
        let ids: Vec<&str> = items.iter().map(|i| i.external_id.as_str()).collect();
        assert_eq!(ids, vec!["p1", "p1~2", "p1~3"]);
        let dir = Path::new("/feeds");
        assert_eq!(
            items[0].photos,
            vec![FeedPhoto::Path(dir.join("front.jpg"))]
        );
        assert_eq!(
            items[0].metadata,
            json!({"name": "Red shoe", "brand": "acme", "price": "40", "product": {"id": "p1"}})
        );
        // The words once, with the first photo; the attributes and the key with every photo.
        assert_eq!(
            items[2].metadata,
            json!({"brand": "acme", "price": "40", "product": {"id": "p1"}})
        );
        assert_eq!(items[2].photos, vec![FeedPhoto::Path(dir.join("worn.jpg"))]);
        // Without a product key, several photos are refused with what to do.
        let e =
            by_photo(vec![product.clone()], &CollectionSettings::default()).expect_err("no key");
        assert!(e.to_string().contains("--group-by"), "{e}");
        // A feed id that names another product's photo is refused.
        let mut clash = product.clone();
        clash.external_id = "p1~2".into();
        clash.photos.truncate(1);
        let mut p1 = product;
        p1.photos.truncate(2);
        let e = by_photo(vec![p1, clash], &settings).expect_err("clash");
        assert!(e.to_string().contains("another item's photo"), "{e}");
    }

    #[test]
    fn the_guard_refuses_withdrawing_more_than_the_share_and_names_the_share_that_would_pass() {
        let stored = |n: i64| crate::store::SyncedImage {
            id: n,
            external_id: format!("sku-{n}"),
            content_hash: None,
            vision_id: "v".into(),
            metadata: Value::Null,
            captions: vec![],
        };
        let catalogue = Catalogue {
            items: (1..=5).map(|n| (format!("sku-{n}"), stored(n))).collect(),
            without_external_id: 0,
        };
        let keep = |ids: &[i64]| -> Vec<FeedItem> {
            ids.iter()
                .map(|n| FeedItem {
                    line: *n as usize,
                    external_id: format!("sku-{n}"),
                    photos: vec![],
                    metadata: Value::Null,
                    captions: vec![],
                })
                .collect()
        };
        let shop = CollectionName::parse("shop").expect("name");
        let e = withdrawals(&catalogue, &keep(&[1, 2, 3]), 0.2, &shop).expect_err("40%");
        assert!(
            e.contains("leaves out 2 of the 5 items \"shop\"") && e.contains("(40.0%)"),
            "{e}"
        );
        assert!(e.contains("--max-delete-share 0.40 or more"), "{e}");
        let gone = withdrawals(&catalogue, &keep(&[1, 2, 3]), 0.4, &shop).expect("allowed");
        let gone: Vec<i64> = gone.iter().map(|(_, id)| *id).collect();
        assert_eq!(gone, [4, 5]);
    }
}
