#!/bin/sh
# Regenerates tbproto/tfevents.pb.go from tbproto/tfevents.proto with
# Debian's protoc (apt-get install protobuf-compiler) and the official Go
# plugin at the version go.mod requires:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
set -eu
cd "$(dirname "$0")/tbproto"
protoc --go_out=. --go_opt=paths=source_relative tfevents.proto
