//go:build !unix

package archive

// oNoFollow is 0 where the platform has no O_NOFOLLOW; os.Root and O_EXCL
// still keep Extract inside its directory.
const oNoFollow = 0
