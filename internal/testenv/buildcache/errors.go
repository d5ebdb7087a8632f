package buildcache

import "errors"

// ErrRecipe: a Recipe lacks a field Ensure needs (the error names it).
var ErrRecipe = errors.New("incomplete recipe")

// ErrIncomplete: a build returned without writing every output, or its
// result does not validate.
var ErrIncomplete = errors.New("build incomplete")
