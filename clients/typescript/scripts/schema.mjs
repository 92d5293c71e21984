// src/schema.ts from openapi.json (the server's schema: `manage.py export_openapi_schema`),
// through openapi-typescript's own API. `--check` writes nothing and exits 1 when src/schema.ts
// is not what openapi.json generates (CI runs it in `make lint`).
//
// One change to the generator's output: the recursive StorableJSON component (any JSON value
// PostgreSQL stores byte for byte) is the type alias JsonValue, which TypeScript accepts as
// recursive; the generator's indexed-access form of it does not compile (TS2502,
// openapi-ts/openapi-typescript#1603).
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import openapiTS, { COMMENT_HEADER, astToString } from "openapi-typescript";
import ts from "typescript";

const root = new URL("..", import.meta.url);
const source = JSON.parse(readFileSync(new URL("openapi.json", root), "utf8"));
const target = fileURLToPath(new URL("src/schema.ts", root));
const JSON_VALUE =
  "/** Any JSON value PostgreSQL stores byte for byte (the schema's StorableJSON). */\n" +
  "export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };\n";

const ast = await openapiTS(source, {
  defaultNonNullable: false, // a field with a default may be left out of a request
  transform(schemaObject, metadata) {
    if (metadata.path === "#/components/schemas/StorableJSON") {
      return ts.factory.createTypeReferenceNode("JsonValue");
    }
    return undefined;
  },
});
const generated = `${COMMENT_HEADER}${astToString(ast)}\n${JSON_VALUE}`;

if (process.argv.includes("--check")) {
  let current = "";
  try {
    current = readFileSync(target, "utf8");
  } catch {
    // missing: differs
  }
  if (current !== generated) {
    console.error("src/schema.ts is not what openapi.json generates: run `npm run generate` in clients/typescript");
    process.exit(1);
  }
  console.log("src/schema.ts matches openapi.json");
} else {
  writeFileSync(target, generated);
  console.log(`wrote ${target}`);
}
