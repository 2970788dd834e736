# verl's newer SFT entry point (verl.trainer.sft_trainer, the engine/optim config groups): multi-turn conversations;
# paths and sizes rewritten for a 2-core CPU and a tiny model.
set -xeuo pipefail

ENTRYPOINT=${ENTRYPOINT:-"-m verl.trainer.sft_trainer"}
SP_SIZE=${SP_SIZE:-2}
ENGINE_CONFIG="\
    engine=fsdp \
    optim=fsdp \
    optim.lr=2e-5 \
    optim.lr_warmup_steps_ratio=0.01 \
    optim.weight_decay=0.1 \
    optim.betas=[0.9,0.95] \
    optim.clip_grad=1.0 \
    optim.min_lr_ratio=0.1 \
    optim.warmup_style=cosine \
    engine.ulysses_sequence_parallel_size=${SP_SIZE} \
    engine.strategy=fsdp2"

torchrun --standalone --nnodes=1 --nproc-per-node=${NUM_TRAINERS:-1} \
    ${ENTRYPOINT} \
    data.train_files="${DATA_DIR}/train.parquet" \
    data.train_batch_size=8 \
    data.max_length=128 \
    data.pad_mode=no_padding \
    data.truncation=error \
    data.use_dynamic_bsz=True \
    data.max_token_len_per_gpu=512 \
    data.multiturn.enable=true \
    data.multiturn.messages_key=messages \
    model.path=$MODEL_PATH \
    model.use_remove_padding=True \
    ${ENGINE_CONFIG} \
    trainer.test_freq=-1 \
    trainer.save_freq=100 \
    trainer.logger=['console'] \
    trainer.project_name=verl_sft_test \
    trainer.experiment_name=tiny-sft \
    trainer.total_epochs=1 \
    trainer.default_local_dir="${CKPT_HOME}" \
    trainer.resume_mode=auto \
    trainer.max_ckpt_to_keep=5 \
    checkpoint.save_contents=[model,optimizer,extra]
