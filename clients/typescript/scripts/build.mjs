// Builds the package: copies the protos of the repository (or of TOOLMESH_PROTO) into proto/,
// generates their TypeScript types into src/gen/ (proto-loader-gen-types), and compiles
// src/ into dist/. The client loads the protos from proto/ at run time.
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const require = createRequire(import.meta.url);
const source = process.env.TOOLMESH_PROTO ?? join(here, "..", "..", "proto");
const target = join(here, "proto");
if (!existsSync(join(source, "toolmesh", "v1", "tools.proto"))) {
  if (!existsSync(join(target, "toolmesh", "v1", "tools.proto"))) {
    console.error(`@toolmesh/client: no protos at ${source}; build from a toolmesh checkout or set TOOLMESH_PROTO`);
    process.exit(1);
  }
} else if (source !== target) {
  rmSync(target, { recursive: true, force: true });
  cpSync(join(source, "toolmesh"), join(target, "toolmesh"), { recursive: true });
}
const node = process.execPath;
const genTypes = join(dirname(require.resolve("@grpc/proto-loader/package.json")), "build", "bin", "proto-loader-gen-types.js");
rmSync(join(here, "src", "gen"), { recursive: true, force: true });
execFileSync(node, [genTypes, "--longs=String", "--enums=String", "--defaults", "--oneofs", "--grpcLib=@grpc/grpc-js",
  `--includeDirs=${target}`, "--outDir=src/gen",
  "toolmesh/v1/tools.proto", "toolmesh/v1/knowledge.proto"], { cwd: here, stdio: "inherit" });
execFileSync(node, [require.resolve("typescript/bin/tsc"), "-p", "."], { cwd: here, stdio: "inherit" });
