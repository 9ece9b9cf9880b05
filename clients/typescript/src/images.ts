// What the client takes as a photo, and how it goes into a JSON body: bytes as base64 (`data`), a web address
// as `url` (fetched by the server, on servers started with --url-ingest: docs/api.md, "URL ingest").

/**
 * A photo: a `Blob` or `File`, bytes (`Uint8Array`, `ArrayBuffer`), a string holding base64 or a `data:` URL,
 * or a web address (a `URL`, or a string starting with `http://` or `https://`) for the server to fetch.
 * Base64 never contains `:`, so a string is never both.
 */
export type ImageInput = Blob | Uint8Array | ArrayBuffer | URL | string;

/** The JSON form of a photo: exactly one of `data` (base64 or a data: URL) and `url`. */
export type ImageSource = { data: string; url?: undefined } | { url: string; data?: undefined };

function isWebAddress(s: string): boolean {
  return /^https?:\/\//i.test(s);
}

/** Bytes as base64, in browsers and Node alike (`btoa` is global in both). */
export function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) {
    binary += String.fromCharCode(...bytes.subarray(i, i + chunk));
  }
  return btoa(binary);
}

export async function imageSource(image: ImageInput): Promise<ImageSource> {
  if (image instanceof URL) return { url: image.href };
  if (typeof image === "string") {
    if (image.length === 0) throw new TypeError("an image string is empty: give base64, a data: URL or an http(s) URL");
    return isWebAddress(image) ? { url: image } : { data: image };
  }
  if (image instanceof Uint8Array) return { data: bytesToBase64(image) };
  if (image instanceof ArrayBuffer) return { data: bytesToBase64(new Uint8Array(image)) };
  if (typeof Blob !== "undefined" && image instanceof Blob) {
    return { data: bytesToBase64(new Uint8Array(await image.arrayBuffer())) };
  }
  throw new TypeError("an image must be a Blob or File, a Uint8Array or ArrayBuffer, a base64 string or a URL");
}

/** For the operations that take the photo itself (search, embed, upsert): base64, never a web address. */
export async function imageData(image: ImageInput, what: string): Promise<string> {
  const src = await imageSource(image);
  if (src.url !== undefined) {
    throw new TypeError(`${what} takes the photo itself (bytes, a Blob or base64), not a web address: ${src.url}`);
  }
  return src.data;
}
