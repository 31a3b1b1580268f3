/*
 * text.h - the text room (k3run/text/): between the model's numbers and the
 * words a person reads or writes. The tokenizer turns text into token ids and
 * ids back into bytes (tokenizer.h); the sampler picks the next id from the
 * logits (sampler.h). Nothing here knows about packs, weights or the model:
 * it works on ids, bytes and a logits vector, with the kernels' fixed math.
 */
#ifndef K3_TEXT_H
#define K3_TEXT_H

#include "sampler.h"
#include "tokenizer.h"

#endif
