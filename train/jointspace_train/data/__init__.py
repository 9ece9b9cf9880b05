"""The data the trainer reads: the Flickr8k dataset (`flickr8k`) and the real photos of the preparation's tests
(`photos`)."""
